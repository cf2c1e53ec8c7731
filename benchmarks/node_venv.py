"""The node package's Python environment, for a benchmark arm that measures what a node runs.

The development venv (``.venv``) also holds the dev extra, and some of those packages are picked up
just because they are there: structlog imports rich (import-linter's dependency) for its console
renderer, with pygments and their modules, about 5 MiB of RSS that a node never has. The Debian
package and the node image install exactly ``packaging/deb/requirements.txt`` (pinned, hashed)
into a venv of Debian's python3; ``ensure()`` makes the same venv once per content of that file
and interpreter, outside the clone like the other build caches (``$RHP_NODE_VENV_PREFIX/<key>/``,
default prefix /opt/runtime-hook-proxy/bench-node-venv), and returns its interpreter. Our code comes from the tree
under test on PYTHONPATH, as for every other arm (the built-in plugins are found without entry
points).

    .venv/bin/python benchmarks/node_venv.py     # build it (if needed) and print its python
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "packaging" / "deb" / "requirements.txt"
PREFIX = Path(os.environ.get("RHP_NODE_VENV_PREFIX", "/opt/runtime-hook-proxy/bench-node-venv"))
DEBIAN_PYTHON = Path("/usr/bin/python3")  # what packaging/lib/venv.sh uses (RHP_PY)


def _step(started: float, what: str) -> None:
    print(f"node_venv: [{time.monotonic() - started:4.0f}s] {what}", file=sys.stderr, flush=True)


def ensure(base_python: Path = DEBIAN_PYTHON) -> Path:
    """The node venv's python, built if missing; raises ``RuntimeError`` with pip's last words
    when it cannot be built (no index reachable, say)."""
    if not base_python.exists():
        base_python = Path(sys.base_prefix) / "bin" / "python3"
    version = subprocess.run([str(base_python), "-c", "import sys; print(sys.version)"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + version.encode()).hexdigest()[:16]
    dest = PREFIX / key
    python = dest / "bin" / "python"
    if python.exists():
        return python
    started = time.monotonic()
    tmp = PREFIX / f"{key}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    PREFIX.mkdir(parents=True, exist_ok=True)
    _step(started, f"making the node venv with {base_python} in {dest}")
    subprocess.run([str(base_python), "-m", "venv", str(tmp)], check=True)
    proc = subprocess.run(
        [str(tmp / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input",
         "--require-hashes", "--only-binary=:all:", "--no-deps", "-r", str(REQUIREMENTS)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"pip install -r {REQUIREMENTS.relative_to(REPO)}: {proc.stderr.strip()[-400:]}")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)  # the venv's python finds its site-packages from pyvenv.cfg beside it
    _step(started, f"built {python}")
    return python


if __name__ == "__main__":
    print(ensure())
