"""``benchmarks/proxy_memory.py`` runs end to end in a tiny configuration, so it cannot rot: our
proxy and, when scripts/build-koord.sh has built it, koord-runtime-proxy (skipped with the reason
otherwise) come up against the in-memory CRI runtime, take 200 containers and a few pod
lifecycles, and every arm has its RSS row. What is checked is the plumbing and the table's
shape, never a size."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "proxy_memory.py"


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--lifecycles", "3", "--every", "2", *args],
                          capture_output=True, text=True, env=env, timeout=840, stdin=subprocess.DEVNULL,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


# slow: builds the node package's venv once (pip, about 20 s; the wheels' hashes are pinned) and
# runs the benchmark with our proxy on it beside the development venv's
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_node_venv_arm_is_measured_beside_ours() -> None:
    out = _run("--no-koord")
    assert "| RSS, MiB | ours | ours-node |" in out, out
    assert re.search(r"^\| 200 containers \| [0-9.]+ \| [0-9.]+ \|$", out, re.MULTILINE), out


# slow: runs the benchmark end to end with proxy processes (48 s and 28 s in the unit tier on
# the loaded machine): the full suite runs it, the fast tier (scripts/test.sh --unit) does not.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_without_the_koord_binary_our_proxy_is_still_measured(tmp_path: Path) -> None:
    absent = tmp_path / "koord-runtime-proxy"
    out = _run("--koord", str(absent), "--no-node-venv")
    assert f"koord-runtime-proxy arm skipped: no binary at {absent}" in out, out
    assert "| RSS, MiB | ours |" in out, out
    for label in ("start", "200 containers", "2 lifecycles", "3 lifecycles", "peak (VmHWM)"):
        assert re.search(rf"^\| {re.escape(label)} \| [0-9.]+ \|$", out, re.MULTILINE), out


@pytest.mark.requires_root  # koord-runtime-proxy creates its fixed hook directory under /etc
@pytest.mark.timeout(900)
def test_the_koord_arm_is_measured_beside_ours() -> None:
    sys.path.insert(0, str(REPO / "benchmarks" / "transport"))
    try:
        import run as transport  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    binary, why = transport.koord_binary(None)
    if binary is None:
        pytest.skip(f"koord-runtime-proxy not built: {why}")
    out = _run("--koord", str(binary), "--no-node-venv")
    assert "| RSS, MiB | ours | koord-runtime-proxy |" in out, out
    assert re.search(r"^\| 200 containers \| [0-9.]+ \| [0-9.]+ \|$", out, re.MULTILINE), out
