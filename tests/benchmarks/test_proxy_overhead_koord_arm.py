"""The koord-runtime-proxy arm of ``benchmarks/proxy_overhead.py --rounds`` is optional: without
the binary (scripts/build-koord.sh builds it, and CI does not) the benchmark says why it skipped
that arm and still measures the others (the finder is benchmarks/transport/run.py's, tested in
test_transport_koord_arm.py). What is checked is the plumbing and the table's shape, never a
speed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rhp_devenv.containerd import binaries_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "proxy_overhead.py"


@pytest.mark.requires_root
@pytest.mark.timeout(900)
def test_rounds_without_the_binary_still_measure_direct_and_ours(tmp_path: Path) -> None:
    if binaries_for("1.6").missing():
        pytest.skip("containerd 1.6 is not installed; scripts/install-deps.sh installs it")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"}
    absent = tmp_path / "koord-runtime-proxy"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--quick", "--koord", str(absent)],
                          capture_output=True, text=True, env=env, timeout=840, stdin=subprocess.DEVNULL,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = proc.stdout
    assert f"koord-runtime-proxy arm skipped: no binary at {absent}" in out, out
    assert "| measure | direct | ours, every plugin | ours, no plugins |" in out, out
    cell = r"[0-9.]+ \[[0-9.]+, [0-9.]+\]"
    for measure, direct in (("Version p50, ms", cell), ("pod lifecycle (7 calls) p50, ms", cell),
                            ("proxy RSS per round, MiB", "n/a")):
        assert re.search(rf"^\| {re.escape(measure)} \| {direct} \| {cell} \| {cell} \|$", out, re.MULTILINE), \
            f"no {measure} row:\n{out}"
    assert "koord-runtime-proxy |" not in out, out
