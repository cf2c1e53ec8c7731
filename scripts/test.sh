#!/usr/bin/env bash
# Set up this machine and run every check: the one command to "set up and run the tests".
#
#   bash scripts/test.sh [PYTEST ARGS...]     (as root; CI runs it through .ci/run)
#   bash scripts/test.sh tests/e2e            (the same set-up and checks, then only those tests)
#   bash scripts/test.sh --unit [PYTEST ARGS...]
#                                             the fast tier: no root, no cluster, no containerd,
#                                             nothing built; the existing .venv, ruff,
#                                             lint-imports, then the tests that need none of
#                                             those (UNIT_ARGS below). README, "Tests".
#
# Steps: scripts/install-deps.sh (Debian packages, containerd 1.7/2.1, .venv), ruff, mypy on
# the packages that exist, lint-imports (the layering contracts in pyproject.toml), then pytest
# over tests/. Every step runs even when an earlier one failed; the exit code is non-zero when
# any failed. pytest finding no test (exit 5) is a failure.
# Never reads standard input. Environment:
#   RHP_PYTEST_TIMEOUT      per-test timeout in seconds (default 180)
#   RHP_REQUIRE_CONTAINERD  versions that must not be skipped (default 1.6, the Debian package)
#   RHP_REQUIRE_CRITEST     1 (default): the critest tests fail, not skip, without the binary
#   RHP_REQUIRE_HELM        1 (default): the chart's tests fail, not skip, without helm
#                           (scripts/build-helm.sh)
#   RHP_REQUIRE_V2          1 (default): the v2 tier (tests/v2/, a cgroup v2 guest under QEMU)
#                           fails instead of skipping without root, QEMU or its image
#   RHP_REQUIRE_KUBE        1 (default): the end-to-end tests (tests/e2e/) fail instead of
#                           skipping when the kube binary (scripts/build-kube.sh) is missing
#   HYPOTHESIS_PROFILE      ci (default: the same examples every run) or random (tests/conftest.py)
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec </dev/null
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE-ci}

# The fast tier leaves out what needs root, containerd, a cluster, a VM or a build: the tests
# marked so (pyproject.toml's markers, tests/conftest.py's requires_root) and the folders and
# modules that build or boot something.
UNIT_ARGS=(-m "not integration and not e2e and not v2 and not slow and not requires_root"
  --ignore=tests/integration --ignore=tests/e2e --ignore=tests/v2
  --ignore=tests/test_image.py --ignore=tests/test_deb.py --ignore=tests/test_wheel.py
  --ignore=tests/test_wheel_install.py --ignore=tests/test_install_deps.py --ignore=tests/test_helm.py)
if [[ ${1-} == --unit ]]; then
  shift
  [[ -x .venv/bin/pytest ]] || { echo "test.sh --unit: no .venv: run 'sudo bash scripts/install-deps.sh' once" >&2; exit 1; }
  export RHP_REQUIRE_CONTAINERD="" RHP_REQUIRE_CRITEST=0 RHP_REQUIRE_KUBE=0 RHP_REQUIRE_HELM=0 RHP_REQUIRE_V2=0
  rc=0
  .venv/bin/ruff check . || rc=1
  .venv/bin/lint-imports --no-cache >/dev/null || { .venv/bin/lint-imports --no-cache; rc=1; }
  # pytest-xdist: RHP_UNIT_WORKERS processes (default 4: a serial run is two thirds waiting, so
  # more workers than the 2 cores overlap the waits) share the tests out;
  # `-n 0` among the arguments runs them in this process, one after another.
  .venv/bin/pytest -q -p no:cacheprovider --timeout="${RHP_PYTEST_TIMEOUT:-180}" -n "${RHP_UNIT_WORKERS:-4}" \
    "${UNIT_ARGS[@]}" tests/ "$@" || rc=1
  exit "$rc"
fi

failed=()
step() {
  local name=$1
  shift
  printf '\n==> %s: %s\n' "$name" "$*"
  local started=$SECONDS
  "$@"
  local rc=$?
  printf '<== %s: exit %d in %ds\n' "$name" "$rc" $((SECONDS - started))
  ((rc == 0)) || failed+=("$name (exit $rc)")
  return "$rc"
}

if [[ $(id -u) -eq 0 ]]; then
  if ! step install-deps bash scripts/install-deps.sh; then
    echo "test.sh: install-deps failed; not running the checks" >&2
    exit 1
  fi
elif [[ -x .venv/bin/pytest ]]; then
  echo "test.sh: not root: skipping scripts/install-deps.sh, using the existing .venv" >&2
else
  echo "test.sh: not root and no .venv: run 'sudo bash scripts/install-deps.sh' first" >&2
  exit 1
fi

step ruff .venv/bin/ruff check .

packages=()
for pkg in koord_formats rhp_ops rhp_kube runtime_proxy hooks scheduler_ext colocation_manager cri_protos examples devenv/rhp_devenv; do
  if [[ -d $pkg ]] && find "$pkg" -name '*.py' -print -quit | grep -q .; then
    packages+=("$pkg")
  fi
done
if ((${#packages[@]})); then
  step mypy .venv/bin/mypy --explicit-package-bases "${packages[@]}"
fi

step lint-imports .venv/bin/lint-imports --no-cache

export RHP_REQUIRE_CONTAINERD=${RHP_REQUIRE_CONTAINERD-1.6}
export RHP_REQUIRE_CRITEST=${RHP_REQUIRE_CRITEST-1}
export RHP_REQUIRE_KUBE=${RHP_REQUIRE_KUBE-1}
export RHP_REQUIRE_HELM=${RHP_REQUIRE_HELM-1}
export RHP_REQUIRE_V2=${RHP_REQUIRE_V2-1}
# With a test path among the arguments (`bash scripts/test.sh tests/e2e`), pytest runs only what
# the arguments name; otherwise everything under tests/.
targets=(tests/)
for arg in "$@"; do
  if [[ $arg != -* && -e ${arg%%::*} ]]; then
    targets=()
  fi
done
step pytest .venv/bin/pytest -q -p no:cacheprovider --timeout="${RHP_PYTEST_TIMEOUT:-180}" "${targets[@]}" "$@"
pytest_rc=$?
if ((pytest_rc == 5)); then
  echo "test.sh: pytest collected no tests: that counts as a failure" >&2
fi

echo
if ((${#failed[@]})); then
  printf 'test.sh: FAILED: %s\n' "${failed[*]}"
  exit 1
fi
echo "test.sh: all checks passed"
