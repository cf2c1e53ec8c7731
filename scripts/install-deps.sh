#!/usr/bin/env bash
# Install everything the tests, the demo and the benchmarks need, on a fresh Debian 12 machine.
#
# Run as root from anywhere (it works from the repository root). Idempotent: a second run only
# checks. What it does:
#   1. Debian packages: containerd (1.6), runc, busybox-static, containernetworking-plugins, ...
#   2. containerd 1.7 (Debian trixie) and 2.1 (Debian sid), fetched as .debs through a temporary
#      apt sources list (the system's apt config is never changed) and unpacked with `dpkg -x`
#      into $RHP_CONTAINERD_PREFIX/<major.minor>/ (default /opt/runtime-hook-proxy/containerd).
#      A failed fetch is a warning: the tests for that version then skip and say why.
#   3. The project's virtualenv in .venv with `pip install -e '.[dev]'` and the development
#      harness (`pip install -e ./devenv`: private containerd, images, CRI client, demo).
#   4. The one-node cluster's components (kube-apiserver, kube-controller-manager, kube-scheduler,
#      kubelet, kubectl, etcd) of Kubernetes v1.37.2 and v1.34.4, built from devenv/kube's pinned
#      Go modules by scripts/build-kube.sh into $RHP_KUBE_PREFIX (default
#      /opt/runtime-hook-proxy/kube): about 5 minutes each the first time, nothing when their
#      go.mod, go.sum and main.go are unchanged. A failed build is a warning: the end-to-end tests
#      then skip (or fail, with RHP_REQUIRE_KUBE=1).
#   5. helm (for packaging/helm/: tests/test_helm.py, tests/e2e/test_e2e_helm.py) from its Go module
#      by scripts/build-helm.sh into $RHP_HELM_PREFIX (default /opt/runtime-hook-proxy/helm): about
#      1.5 to 4 minutes the first time, nothing when it is there. A failed build is a warning.
#   6. The cgroup v2 guest node for tests/v2/ by scripts/build-v2node.sh into $RHP_V2NODE_PREFIX
#      (default /opt/runtime-hook-proxy/v2node): about 2 minutes the first time (kernel package,
#      mmdebstrap, mke2fs), nothing when its inputs are unchanged. A failed build is a warning.
#
#   bash scripts/install-deps.sh          everything above: what scripts/test.sh needs
#   bash scripts/install-deps.sh --demo   only what scripts/demo.sh needs: step 1's packages for
#                                         containerd 1.6 (no QEMU, mmdebstrap or umoci) and step 3
#                                         without the dev tools (`pip install -e . -e ./devenv`);
#                                         no containerd 1.7/2.1, critest, Kubernetes, helm or v2
#                                         node. A later run without --demo adds the rest.
# Environment: RHP_CONTAINERD_PREFIX (see above), RHP_SKIP_EXTRA_CONTAINERD=1 (skip step 2),
# RHP_DEBIAN_URI (mirror for step 2; default: the machine's own Debian URI from its apt sources),
# RHP_KUBE_PREFIX (step 4), RHP_SKIP_KUBE=1 (skip step 4), RHP_SKIP_V2NODE=1 (skip step 6),
# RHP_LOCK_DIR (where the machine-wide lock file is; default /run/lock). pip honours its own
# PIP_CACHE_DIR, Go its GOCACHE and GOMODCACHE (point them at empty directories for a cold run).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO_ROOT=$(pwd)
DEMO=0
case "${1-}" in
  "") ;;
  --demo) DEMO=1 ;;
  *) echo "usage: bash scripts/install-deps.sh [--demo]" >&2; exit 2 ;;
esac
PREFIX=${RHP_CONTAINERD_PREFIX:-/opt/runtime-hook-proxy/containerd}
export DEBIAN_FRONTEND=noninteractive

log() { printf 'install-deps: %s\n' "$*"; }
warn() { printf 'install-deps: WARNING: %s\n' "$*" >&2; }

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: must run as root (apt-get, /opt)" >&2
  exit 1
fi

# Several engineers (and CI) may run this at once on one machine: serialize the whole script.
LOCK_DIR=${RHP_LOCK_DIR:-/run/lock}
[[ -d $LOCK_DIR && -w $LOCK_DIR ]] || LOCK_DIR=/tmp
exec 9>"$LOCK_DIR/runtime-hook-proxy-install-deps.lock"
flock 9

declare -a SUMMARY=()

# --- 1. Debian packages ---------------------------------------------------------------------------
# The demo's: containerd 1.6, runc, the busybox image's binary, the loopback CNI plugin.
APT_PACKAGES=(containerd runc busybox-static containernetworking-plugins ca-certificates util-linux)
if ((!DEMO)); then
  # the images (packaging/image/build.sh: mmdebstrap, umoci); the cgroup v2 guest node
  # (scripts/build-v2node.sh, rhp_devenv.v2node): QEMU (TCG), e2fsprogs for mke2fs -d, cpio for
  # its initrd, kmod for depmod over the unpacked kernel's modules
  APT_PACKAGES+=(mmdebstrap umoci qemu-system-x86 e2fsprogs cpio kmod)
fi
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  APT_PACKAGES+=(python3-venv)
fi
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done
if ((${#missing[@]})); then
  log "apt-get update; installing: ${missing[*]}"
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${APT_PACKAGES[@]}"
else
  log "Debian packages already installed: ${APT_PACKAGES[*]}"
fi
SUMMARY+=("containerd 1.6: $(/usr/bin/containerd --version | awk '{print $3}') (/usr/bin/containerd)")

# --- 2. containerd 1.7 and 2.1 from other Debian suites -------------------------------------------
debian_uri() {
  # The machine's own Debian mirror URI, from deb822 sources or the classic one-line list.
  local f uri=""
  for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' "$f")
    [[ -n $uri ]] && break
  done
  if [[ -z $uri && -r /etc/apt/sources.list ]]; then
    uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i ~ /:\/\// && $i !~ /security/) { print $i; exit } }' \
      /etc/apt/sources.list)
  fi
  printf '%s\n' "${RHP_DEBIAN_URI:-${uri:-http://deb.debian.org/debian}}"
}

fetch_containerd() {
  # fetch_containerd SUITE WANT_MAJOR_MINOR: download containerd from SUITE, unpack under $PREFIX.
  local suite=$1 want=$2 dest="$PREFIX/$2"
  if [[ -x $dest/usr/bin/containerd && -x $dest/usr/bin/containerd-shim-runc-v2 ]]; then
    SUMMARY+=("containerd $want: $("$dest/usr/bin/containerd" --version | awk '{print $3}') ($dest, already there)")
    return 0
  fi
  local tmp uri keyring opt
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'; trap - RETURN" RETURN
  uri=$(debian_uri)
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  opt=""
  [[ -r $keyring ]] && opt="[signed-by=$keyring] "
  printf 'deb %s%s %s main\n' "$opt" "$uri" "$suite" >"$tmp/sources.list"
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/debs"
  local -a aptopts=(
    -o "Dir::Etc::sourcelist=$tmp/sources.list" -o "Dir::Etc::sourceparts=-"
    -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache"
    -o "APT::Get::List-Cleanup=0" -o "APT::Sandbox::User=root" -q
  )
  log "fetching containerd from Debian $suite ($uri)"
  if ! apt-get "${aptopts[@]}" --error-on=any update >"$tmp/update.log" 2>&1; then
    warn "apt-get update for Debian $suite failed; containerd $want tests will skip. Log:"
    sed 's/^/    /' "$tmp/update.log" >&2
    SUMMARY+=("containerd $want: MISSING (apt-get update for $suite failed)")
    return 0
  fi
  if ! (cd "$tmp/debs" && apt-get "${aptopts[@]}" download containerd) >"$tmp/download.log" 2>&1; then
    warn "apt-get download containerd from Debian $suite failed; containerd $want tests will skip. Log:"
    sed 's/^/    /' "$tmp/update.log" "$tmp/download.log" >&2
    SUMMARY+=("containerd $want: MISSING (download from $suite failed)")
    return 0
  fi
  local deb version got
  deb=$(ls "$tmp"/debs/containerd_*.deb)
  version=$(dpkg-deb -f "$deb" Version)
  got=$(sed -E 's/^([0-9]+:)?([0-9]+\.[0-9]+).*/\2/' <<<"$version")
  if [[ $got != "$want" ]]; then
    warn "Debian $suite has containerd $version, not $want.x; containerd $want tests will skip."
    SUMMARY+=("containerd $want: MISSING ($suite has $version)")
    return 0
  fi
  mkdir -p "$PREFIX"
  rm -rf "$dest.tmp"
  dpkg -x "$deb" "$dest.tmp"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
  SUMMARY+=("containerd $want: $("$dest/usr/bin/containerd" --version | awk '{print $3}') ($dest)")
}

if ((DEMO)); then
  log "--demo: not fetching containerd 1.7 and 2.1 (the demo runs on the newest one there)"
elif [[ ${RHP_SKIP_EXTRA_CONTAINERD:-0} == 1 ]]; then
  log "RHP_SKIP_EXTRA_CONTAINERD=1: not fetching containerd 1.7 and 2.1"
else
  fetch_containerd trixie 1.7
  fetch_containerd sid 2.1
fi

# --- 3. Python virtualenv ---------------------------------------------------------------------------
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv with $(command -v python3) ($(python3 -V 2>&1))"
  python3 -m venv .venv
fi
# The stamp is the hash of both pyproject.toml files, with " demo" after it when only the demo's
# part is installed (no dev extra): the full install is good for the demo too, not the reverse.
stamp=.venv/.runtime-hook-proxy-deps
want_stamp=$(cat pyproject.toml devenv/pyproject.toml | sha256sum | awk '{print $1}')
have_stamp=$(cat "$stamp" 2>/dev/null || true)
if [[ $have_stamp == "$want_stamp" && -x .venv/bin/pytest ]] || { ((DEMO)) && [[ $have_stamp == "$want_stamp demo" ]]; }; then
  log ".venv is up to date with pyproject.toml"
elif ((DEMO)); then
  log "pip install -e . -e ./devenv into .venv (the demo's part; no dev tools)"
  .venv/bin/python -m pip install -q -e . -e ./devenv </dev/null
  printf '%s demo\n' "$want_stamp" >"$stamp"
else
  log "pip install -e '.[dev]' -e ./devenv into .venv"
  .venv/bin/python -m pip install -q -e '.[dev]' -e ./devenv </dev/null
  printf '%s\n' "$want_stamp" >"$stamp"
fi
SUMMARY+=(".venv: $(.venv/bin/python -V 2>&1) at $REPO_ROOT/.venv")

if ((DEMO)); then
  log "--demo: not building critest, Kubernetes, helm or the v2 node (scripts/test.sh does)"
  log "summary:"
  printf '  %s\n' "${SUMMARY[@]}"
  exit 0
fi

# Each build script prints its result's path as its last line on stdout (a tool's chatter there
# before it, such as mke2fs's, made the v2 node's path unreadable and the set-up fail).

# --- critest (cri-tools' CRI validation suite, for tests/integration/test_critest.py) ------------
# Built from devenv/critest/ by scripts/build-critest.sh into /opt/runtime-hook-proxy/critest/
# (cached there: a second run builds nothing). A failed build is a warning: the critest tests then
# skip, and fail under scripts/test.sh (RHP_REQUIRE_CRITEST=1).
if critest_bin=$(bash scripts/build-critest.sh | tail -n 1); then
  SUMMARY+=("critest: $critest_bin")
else
  warn "scripts/build-critest.sh failed; tests/integration/test_critest.py will skip (fail under scripts/test.sh)"
  SUMMARY+=("critest: MISSING (scripts/build-critest.sh failed)")
fi
# --- end of critest -------------------------------------------------------------------------------

# --- 4. Kubernetes components for the end-to-end tests (tests/e2e/) ------------------------------
if [[ ${RHP_SKIP_KUBE:-0} == 1 ]]; then
  log "RHP_SKIP_KUBE=1: not building the Kubernetes components"
  SUMMARY+=("kube: not built (RHP_SKIP_KUBE=1)")
elif kube_bins=$(bash scripts/build-kube.sh | grep '/kube$'); then
  # a line per version built: each binary's path (no other line ends so)
  for kube_bin in $kube_bins; do
    # sed reads to the end: `head -1` closed the pipe early, kubectl died of SIGPIPE and, under
    # pipefail and set -e, the whole script exited 141 now and then.
    SUMMARY+=("kube: $("$kube_bin" kubectl version --client 2>/dev/null | sed -n 1p) ($kube_bin)")
  done
else
  warn "scripts/build-kube.sh failed; the end-to-end tests will skip (or fail with RHP_REQUIRE_KUBE=1)"
  SUMMARY+=("kube: MISSING (scripts/build-kube.sh failed)")
fi

# --- 5. helm, for the chart's tests (tests/test_helm.py, tests/e2e/test_e2e_helm.py) -------------
if helm_bin=$(bash scripts/build-helm.sh | tail -n 1); then
  SUMMARY+=("helm: $("$helm_bin" version --short 2>/dev/null) ($helm_bin)")
else
  warn "scripts/build-helm.sh failed; the chart's tests will skip (fail with RHP_REQUIRE_HELM=1)"
  SUMMARY+=("helm: MISSING (scripts/build-helm.sh failed)")
fi

# --- 6. the cgroup v2 guest node, for the v2 tier (tests/v2/) -------------------------------------
if [[ ${RHP_SKIP_V2NODE:-0} == 1 ]]; then
  log "RHP_SKIP_V2NODE=1: not building the v2 node"
  SUMMARY+=("v2 node: not built (RHP_SKIP_V2NODE=1)")
elif v2_dir=$(bash scripts/build-v2node.sh | tail -n 1); then
  SUMMARY+=("v2 node: $(cat "$v2_dir/kernel-version") ($v2_dir)")
else
  warn "scripts/build-v2node.sh failed; the v2 tier (tests/v2/) will skip (fail with RHP_REQUIRE_V2=1)"
  SUMMARY+=("v2 node: MISSING (scripts/build-v2node.sh failed)")
fi

log "summary:"
for line in "${SUMMARY[@]}"; do
  printf '  %s\n' "$line"
done
