#!/usr/bin/env bash
# The README's first command: set up everything on a fresh machine of this kind (as root), then
# run the proxy in front of a private containerd with a demo pod, and print what the hooks did.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh
exec .venv/bin/python -m rhp_devenv.demo "$@"
