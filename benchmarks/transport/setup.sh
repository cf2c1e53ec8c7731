#!/usr/bin/env bash
# Install Debian's gRPC-Go sources, and build the transport benchmark's Go ends (go/echoserver and
# go/client) offline, into _work/transport-bench/bin, with the machine's Go (packaging/lib/go.sh:
# the same toolchain the other builds pick). Debian's golang-go is not installed: its older Go at
# /usr/bin/go would come first on a short PATH and change which toolchain, and so which cached
# binaries, the build scripts find.
#
# Debian's golang-google-grpc-dev (and its dependencies) install Go sources under
# /usr/share/gocode/src, so the build runs in GOPATH mode (GO111MODULE=off) with a private
# GOPATH that links our sources in as "rhpbench", followed by /usr/share/gocode. No module proxy
# or network is used (GOPROXY=off, GOFLAGS=-mod=mod is not needed in GOPATH mode).
#
# Usage: bash benchmarks/transport/setup.sh [--build-only]   (root for the apt step)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT="$ROOT/_work/transport-bench"

if [[ ${1:-} != --build-only ]]; then
  missing=()
  for pkg in golang-google-grpc-dev; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

# shellcheck source=packaging/lib/go.sh
source "$ROOT/packaging/lib/go.sh"
GO=$(rhp_go 1.19)
mkdir -p "$OUT/gopath/src" "$OUT/bin" "$OUT/cache"
ln -sfn "$HERE/go" "$OUT/gopath/src/rhpbench"
export GO111MODULE=off GOPROXY=off GOFLAGS= GOPATH="$OUT/gopath:/usr/share/gocode" GOCACHE="$OUT/cache"
cd "$OUT/gopath/src/rhpbench"
"$GO" build -o "$OUT/bin/echoserver" ./echoserver
"$GO" build -o "$OUT/bin/client" ./client
echo "setup.sh: built $OUT/bin/echoserver and $OUT/bin/client ($("$GO" version))"
