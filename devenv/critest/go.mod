// critest, cri-tools' CRI validation suite, pinned for tests/integration/test_critest.py.
// scripts/build-critest.sh builds it (`go test -c` of sigs.k8s.io/cri-tools/cmd/critest); the
// module sources come from the Go module proxy, never from this repository.
module github.com/runtime-hook-proxy/devenv/critest

go 1.24.1

require sigs.k8s.io/cri-tools v1.34.0
