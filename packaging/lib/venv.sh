# shellcheck shell=bash
# What the Debian package (packaging/deb/build.sh) and the images (packaging/image/build.sh) share:
# fetching pinned, hashed wheels into a cache, building our wheel from a copy of the shipped
# packages, and making a venv of Debian's /usr/bin/python3 at its final path inside a staging root.
# Source it; every function dies on error (the callers run under `set -euo pipefail`).

RHP_PY=${RHP_PY:-/usr/bin/python3}

# No byte code from pip's own runs: `pip --python VENV check` imports from the venv (attrs, say), and
# byte code written then would name the staging path (rhp_make_venv compiles it for the final one).
rhp_pip() { PYTHONDONTWRITEBYTECODE=1 "$RHP_PY" -m pip --disable-pip-version-check --no-input "$@"; }

# rhp_fetch_wheels CACHE SCRATCH REQ...: every pinned wheel of REQ... in CACHE (hashes checked on
# every use); fetched from PyPI, binary only, when one is missing.
rhp_fetch_wheels() {
  local cache=$1 scratch=$2 req
  shift 2
  for req in "$@"; do
    if ! rhp_pip download -q --no-index --find-links "$cache" --only-binary=:all: --no-deps --require-hashes \
        -d "$scratch/check" -r "$req" >/dev/null 2>&1; then
      echo "fetching the wheels of $(basename "$req") into $cache" >&2
      rhp_pip download -q --only-binary=:all: --no-deps --require-hashes -d "$cache" -r "$req"
    fi
  done
}

# rhp_build_wheel REPO WORK CACHE BUILD_REQ: our wheel, built offline from a copy of the shipped
# packages (the checkout is left as it was), with the checkout's commit in rhp_ops/COMMIT (what
# rhp_build_info and --version name; RHP_GIT_COMMIT overrides it, e.g. for a tarball without .git);
# prints its path.
rhp_build_wheel() {
  local repo=$1 work=$2 cache=$3 build_req=$4 name version
  local src=$work/src
  mkdir -p "$src"
  cp "$repo/pyproject.toml" "$repo/README.md" "$repo/LICENSE" "$src/"
  for name in runtime_proxy hooks scheduler_ext colocation_manager cri_protos koord_formats rhp_ops rhp_kube; do
    if [[ -d $repo/$name ]]; then
      cp -r "$repo/$name" "$src/$name"
    fi
  done
  find "$src" -name __pycache__ -prune -exec rm -rf {} +
  local commit=${RHP_GIT_COMMIT:-}
  [[ -n $commit ]] || commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || true)
  rm -f "$src/rhp_ops/COMMIT"
  if [[ $commit =~ ^[0-9a-f]{40}([0-9a-f]{24})?$ ]]; then
    printf '%s\n' "$commit" >"$src/rhp_ops/COMMIT"
  else
    echo "rhp_build_wheel: no git commit known (no .git and no RHP_GIT_COMMIT): the build names none" >&2
  fi
  "$RHP_PY" -m venv --without-pip "$work/build"
  rhp_pip --python "$work/build/bin/python" install -q --no-index --find-links "$cache" --require-hashes \
    -r "$build_req"
  rhp_pip --python "$work/build/bin/python" wheel -q --no-deps --no-build-isolation --no-index \
    -w "$work/wheel" "$src" >/dev/null
  version=$("$RHP_PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$repo/pyproject.toml")
  local wheel
  wheel=$(echo "$work"/wheel/runtime_hook_proxy-"$version"-*.whl)
  [[ -f $wheel ]] || { echo "no wheel for version $version in $work/wheel" >&2; return 1; }
  printf '%s\n' "$wheel"
}

# rhp_make_venv ROOT FINAL WHEEL CACHE REQ...: a venv made by the interpreter it will run on, at
# ROOT/FINAL, holding REQ... (installed with --require-hashes from CACHE, nothing downloaded) and
# WHEEL; no pip, no activate scripts, console scripts and pyvenv.cfg naming FINAL, byte code
# compiled for the final paths. Dies when a staging path is left inside ROOT.
rhp_make_venv() {
  local root=$1 final=$2 wheel=$3 cache=$4 req f
  shift 4
  local stage=$root$final
  mkdir -p "$(dirname "$stage")"
  "$RHP_PY" -m venv --without-pip "$stage"
  for req in "$@"; do
    rhp_pip --python "$stage/bin/python" install -q --no-compile --no-index --find-links "$cache" \
      --require-hashes --no-deps -r "$req"
  done
  rhp_pip --python "$stage/bin/python" install -q --no-compile --no-index --no-deps "$wheel"
  rhp_pip --python "$stage/bin/python" check >/dev/null || {
    rhp_pip --python "$stage/bin/python" check >&2
    return 1
  }
  rm -f "$stage"/bin/activate* "$stage"/bin/Activate.ps1
  rm -f "$stage"/lib/python3.11/site-packages/*.dist-info/direct_url.json
  # Console scripts name the staging interpreter; they run from the final one.
  for f in "$stage"/bin/*; do
    [[ -f $f && ! -L $f ]] || continue
    if head -n1 "$f" | grep -qx "#!$stage/bin/python3\?"; then
      sed -i "1s|.*|#!$final/bin/python3|" "$f"
    fi
  done
  sed -i "s|^command = .*|command = $RHP_PY -m venv $final|" "$stage/pyvenv.cfg"
  # The rewritten scripts' hashes and sizes in each RECORD, so RECORD stays true and names no
  # staging path or temporary file (either would make two builds of the same inputs differ).
  "$RHP_PY" - "$stage" <<'PY'
import base64, csv, hashlib, io, os, sys
from pathlib import Path

site = Path(sys.argv[1], "lib", "python3.11", "site-packages")
for record in sorted(site.glob("*.dist-info/RECORD")):
    rows = list(csv.reader(record.read_text().splitlines()))
    # direct_url.json (removed above) names the build's temporary wheel: its entry goes too.
    kept = [row for row in rows if not (row and row[0].endswith(".dist-info/direct_url.json"))]
    changed = len(kept) != len(rows)
    rows = kept
    for row in rows:
        if len(row) == 3 and row[0].startswith("../../../bin/"):
            data = Path(os.path.normpath(site / row[0])).read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            row[1:] = [f"sha256={digest}", str(len(data))]
            changed = True
    if changed:
        out = io.StringIO()
        csv.writer(out).writerows(rows)  # pip writes \r\n, as csv does
        record.write_text(out.getvalue())
PY
  if grep -rlF "$root" "$stage" >/dev/null; then
    echo "build paths left in the venv: $(grep -rlF "$root" "$stage" | head -5 | tr '\n' ' ')" >&2
    return 1
  fi
  # Byte code for the final paths, so the first start writes nothing under FINAL.
  "$RHP_PY" -m compileall -q -j 0 -s "$root" -p / "$stage/lib" >/dev/null
}
