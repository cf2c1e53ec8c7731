#!/usr/bin/env bash
# Build critest, cri-tools' CRI validation suite, from the module pinned in devenv/critest/.
#
#   bash scripts/build-critest.sh               build if needed; print the binary's path on stdout
#   bash scripts/build-critest.sh --print-path  print where the binary is (or would be); no build
#
# critest is a Go test binary: `go test -c` of sigs.k8s.io/cri-tools/cmd/critest, with the
# version stamped in. The sources come from the Go module proxy into Go's module cache; nothing
# is written into the clone. The binary is cached outside the clone, in
# $RHP_CRITEST_PREFIX/<key>/critest (default prefix /opt/runtime-hook-proxy/critest), where <key>
# hashes devenv/critest/{go.mod,go.sum,tools.go}, the build flags and the Go version: a second
# run with the same inputs rebuilds nothing. Progress goes to stderr. Runs as any user who can
# write the prefix; scripts/install-deps.sh calls it. Environment: RHP_CRITEST_PREFIX, GO (the go
# command; default: the newest Go on PATH or at /usr/local/go/bin/go, packaging/lib/go.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODULE=devenv/critest
PREFIX=${RHP_CRITEST_PREFIX:-/opt/runtime-hook-proxy/critest}

RHP_PROGRESS_NAME=build-critest
# shellcheck source=packaging/lib/progress.sh
source packaging/lib/progress.sh  # a line per step with the elapsed time, on stderr
# shellcheck source=packaging/lib/go.sh
source packaging/lib/go.sh  # rhp_go: the one Go every caller picks
log() { rhp_step "$*"; }

GO=$(rhp_go 1.24)

version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/cri-tools" { print $3 }' "$MODULE/go.mod")
if [[ -z $version ]]; then
  log "$MODULE/go.mod does not require sigs.k8s.io/cri-tools"
  exit 1
fi
ldflags="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${version#v}"
key=$({
  cat "$MODULE/go.mod" "$MODULE/go.sum" "$MODULE/tools.go"
  printf '%s\n' "$ldflags"
  "$GO" env GOVERSION GOOS GOARCH
} | sha256sum | cut -c1-16)
dest=$PREFIX/$key
binary=$dest/critest

if [[ ${1:-} == --print-path ]]; then
  printf '%s\n' "$binary"
  exit 0
fi

if [[ ! -x $binary ]]; then
  mkdir -p "$dest"
  # Builds of one key from several clones at once: one builds, the others wait and find it.
  exec 8>"$dest/.lock"
  flock 8
fi
if [[ -x $binary ]]; then
  log "critest $version already built: $binary"
  printf '%s\n' "$binary"
  exit 0
fi

log "building critest $version with $("$GO" env GOVERSION) into $dest"
tmp=$(mktemp "$dest/critest.XXXXXX")
trap 'rm -f "$tmp"' EXIT
compile() (
  cd "$MODULE"
  CGO_ENABLED=0 GOFLAGS=-mod=readonly "$GO" test -c -trimpath -ldflags "$ldflags" -o "$tmp" \
    sigs.k8s.io/cri-tools/cmd/critest >&2
)
rhp_run "go test -c sigs.k8s.io/cri-tools/cmd/critest (about a minute on 2 cores when Go's caches are cold)" compile
chmod 0755 "$tmp"
mv -f "$tmp" "$binary"
trap - EXIT
log "built $binary"
printf '%s\n' "$binary"
