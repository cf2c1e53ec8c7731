#!/usr/bin/env bash
# The README's first command: set up what the demo needs on a fresh machine of this kind (as root:
# containerd 1.6, runc, busybox-static, the .venv without the dev tools; `install-deps.sh --demo`
# builds none of critest, Kubernetes, helm or the v2 node, which only scripts/test.sh needs), then
# run the proxy in front of a private containerd with demo pods, and print what the hooks did.
# Each step's time goes to stderr ("demo.sh: set-up took 28 s"): README, "The two commands".
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh --demo
echo "demo.sh: set-up took ${SECONDS} s" >&2
started=$SECONDS
rc=0
.venv/bin/python -m rhp_devenv.demo "$@" || rc=$?
echo "demo.sh: demo took $((SECONDS - started)) s (exit $rc); ${SECONDS} s in all" >&2
exit "$rc"
