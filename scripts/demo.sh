#!/usr/bin/env bash
# The README's first command: set up what the demo needs on a fresh machine of this kind (as root:
# containerd 1.6, runc, busybox-static, the .venv without the dev tools; `install-deps.sh --demo`
# builds none of critest, Kubernetes, helm or the v2 node, which only scripts/test.sh needs), then
# run the proxy in front of a private containerd with demo pods, and print what the hooks did.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh --demo
exec .venv/bin/python -m rhp_devenv.demo "$@"
