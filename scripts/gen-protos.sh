#!/usr/bin/env bash
# Regenerate the Python modules in cri_protos/ from the .proto files.
# Generation runs at the repository root so the modules import as
# `from cri_protos import api_pb2`. Never edit the generated files by hand;
# `python -m cri_protos.regen --check` tells whether they are stale.
# Interpreter: $PYTHON, else .venv/bin/python, else python.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
exec "${PYTHON}" -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
    cri_protos/api.proto cri_protos/hookserver.proto cri_protos/nri.proto cri_protos/ttrpc.proto
