#!/usr/bin/env bash
# Build one of Koordinator's Go binaries (koord-runtime-proxy by default, or koord-scheduler) from
# Koordinator's Go module at an exact version, as a comparison arm for benchmarks/.
#
#   bash scripts/build-koord.sh [COMPONENT]               build if needed; print the binary's path
#   bash scripts/build-koord.sh [COMPONENT] --print-path  print where it is (or would be); no build
#
# COMPONENT is koord-runtime-proxy (default) or koord-scheduler: the command package
# github.com/koordinator-sh/koordinator/cmd/COMPONENT of version $RHP_KOORD_VERSION (v1.8.0).
# Nothing of Koordinator is in this repository: the wrapper module is written at build time in the
# cache directory, its go.mod requiring Koordinator's module and carrying the `replace` block of
# Koordinator's own go.mod (taken from Go's module cache: a `replace` applies only in the main
# module, and Koordinator's pins the Kubernetes staging modules it needs); `go mod tidy` fills its
# go.sum, checked against the checksum database. Sources stay in Go's module cache and objects in
# Go's build cache, outside the clone. The binary is cached in $RHP_KOORD_PREFIX/<key>/COMPONENT
# (default prefix /opt/runtime-hook-proxy/koord), where <key> hashes the component, the version,
# the module's checksum, this script, the build flags and the Go version: a second run with the
# same inputs rebuilds nothing. Progress goes to stderr; the last line on stdout is the path.
# A cold `go build` of koord-runtime-proxy takes a few minutes on 2 cores, koord-scheduler longer.
# Environment: RHP_KOORD_VERSION, RHP_KOORD_PREFIX, GO (default: the newest Go on PATH or at
# /usr/local/go/bin/go, packaging/lib/go.sh).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODULE=github.com/koordinator-sh/koordinator
VERSION=${RHP_KOORD_VERSION:-v1.8.0}
PREFIX=${RHP_KOORD_PREFIX:-/opt/runtime-hook-proxy/koord}

component=koord-runtime-proxy
print_path=0
for arg in "$@"; do
  case $arg in
    --print-path) print_path=1 ;;
    koord-runtime-proxy | koord-scheduler) component=$arg ;;
    *)
      echo "usage: $0 [koord-runtime-proxy|koord-scheduler] [--print-path]" >&2
      exit 2
      ;;
  esac
done

RHP_PROGRESS_NAME=build-koord
# shellcheck source=packaging/lib/progress.sh
source packaging/lib/progress.sh  # a line per step with the elapsed time, on stderr
# shellcheck source=packaging/lib/go.sh
source packaging/lib/go.sh  # rhp_go: the one Go every caller picks
log() { rhp_step "$*"; }

GO=$(rhp_go 1.25)

ldflags="-s -w"
# The module's checksum names its content exactly; `go mod download` of a cached version is local.
info=$("$GO" mod download -json "$MODULE@$VERSION")
modsum=$(sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p' <<<"$info")
gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p' <<<"$info")
if [[ -z $modsum || ! -f $gomod ]]; then
  log "go mod download $MODULE@$VERSION gave no checksum or go.mod"
  exit 1
fi
key=$({
  printf '%s\n' "$component" "$VERSION" "$modsum" "$ldflags"
  cat "${BASH_SOURCE[0]}"
  "$GO" env GOVERSION GOOS GOARCH
} | sha256sum | cut -c1-16)
dest=$PREFIX/$key
binary=$dest/$component

if ((print_path)); then
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
  log "$component $VERSION already built: $binary"
  printf '%s\n' "$binary"
  exit 0
fi

log "building $component $VERSION with $("$GO" env GOVERSION) into $dest"
src=$dest/wrapper
rm -rf "$src"
mkdir -p "$src"
go_line=$(awk '$1 == "go" { print; exit }' "$gomod")
{
  printf '// Written by scripts/build-koord.sh: builds %s of %s@%s.\n' "$component" "$MODULE" "$VERSION"
  printf 'module rhp.invalid/koordbuild\n\n%s\n\nrequire %s %s\n\n' "$go_line" "$MODULE" "$VERSION"
  awk '/^replace \($/ { on = 1 } on { print } on && /^\)$/ { exit }' "$gomod"
} >"$src/go.mod"
printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd/%s"\n' "$MODULE" "$component" >"$src/tools.go"

tidy() (cd "$src" && GOFLAGS=-mod=mod "$GO" mod tidy >&2)
rhp_run "go mod tidy of the wrapper module (module downloads, cached after the first time)" tidy

tmp=$(mktemp "$dest/$component.XXXXXX")
trap 'rm -f "$tmp"' EXIT
compile() (
  cd "$src"
  CGO_ENABLED=0 GOFLAGS=-mod=readonly "$GO" build -trimpath -ldflags "$ldflags" -o "$tmp" \
    "$MODULE/cmd/$component" >&2
)
rhp_run "go build $MODULE/cmd/$component (minutes on 2 cores when Go's caches are cold)" compile
chmod 0755 "$tmp"
mv -f "$tmp" "$binary"
trap - EXIT
log "built $binary"
printf '%s\n' "$binary"
