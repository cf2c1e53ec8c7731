#!/usr/bin/env bash
# Build runtime-hook-proxy's wheel: dist/runtime_hook_proxy-<version>-py3-none-any.whl
#
#   bash packaging/wheel/build.sh          (prints the wheel's path on stdout)
#
# The same wheel the Debian package and the images install (packaging/lib/venv.sh's
# rhp_build_wheel): built offline from a copy of the shipped packages with the pinned, hashed
# build requirements (packaging/deb/build-requirements.txt, fetched from PyPI once into the cache
# below), naming the checkout's commit (`runtime-proxy --version`, rhp_build_info). The checkout is
# left as it was. Install it into a venv of your own, with the extras you need:
#
#   python3 -m venv "$HOME/runtime-hook-proxy"
#   "$HOME/runtime-hook-proxy/bin/pip" install "./dist/runtime_hook_proxy-<version>-py3-none-any.whl[cluster]"
#
# Needs python3 (3.11 or later) with venv and pip. Environment:
#   RHP_WHEEL_OUT        output directory (default: dist/ in this checkout)
#   RHP_DEB_WHEEL_CACHE  the wheel cache shared with packaging/deb/build.sh and packaging/image/build.sh
#   RHP_GIT_COMMIT       the commit to name when the checkout has no .git
set -euo pipefail
exec </dev/null

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
die() { echo "packaging/wheel/build.sh: $*" >&2; exit 1; }

RHP_PY=${RHP_PY:-$(command -v python3 || true)}
[[ -n $RHP_PY ]] || die "python3 is missing"
"$RHP_PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$RHP_PY is older than Python 3.11"
"$RHP_PY" -c 'import ensurepip, venv' 2>/dev/null || die "$RHP_PY has no venv module (Debian: apt-get install python3-venv)"
"$RHP_PY" -m pip --version >/dev/null 2>&1 || die "$RHP_PY has no pip (Debian: apt-get install python3-pip)"

out=${RHP_WHEEL_OUT:-$repo/dist}
cache=${RHP_DEB_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/runtime-hook-proxy/deb-wheels}
mkdir -p "$out" "$cache"
work=$(mktemp -d /tmp/rhp-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT

RHP_PROGRESS_NAME=packaging/wheel/build.sh
# shellcheck source=packaging/lib/progress.sh
source "$repo/packaging/lib/progress.sh"
# shellcheck source=packaging/lib/venv.sh
source "$repo/packaging/lib/venv.sh"
rhp_run "checking the pinned build requirements in $cache (fetched from PyPI once)" \
  rhp_fetch_wheels "$cache" "$work" "$repo/packaging/deb/build-requirements.txt"
rhp_step "building the wheel from a copy of the shipped packages"
wheel=$(rhp_build_wheel "$repo" "$work" "$cache" "$repo/packaging/deb/build-requirements.txt")
cp "$wheel" "$out/"
rhp_done
printf '%s\n' "$out/$(basename "$wheel")"
