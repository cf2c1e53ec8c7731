//go:build tools

// Package tools only names the package scripts/build-critest.sh builds, so that `go mod tidy`
// keeps its module and checksums in go.mod and go.sum.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/critest"
