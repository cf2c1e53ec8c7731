"""``benchmarks/qos_loops.py`` runs end to end in a tiny configuration (one pod per class, two
rounds, files in a temporary directory, this tree against itself as the baseline), so it cannot
rot; what is checked is that it printed every row with a ratio, never a speed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_qos_loops_benchmark_runs_against_a_baseline() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "qos_loops.py"), "--pods", "1", "--rounds", "2", "--batches", "1",
         "--tmpfs", "--baseline", str(REPO)],
        capture_output=True, text=True, timeout=300, check=False, env={"PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split()[0] for line in proc.stdout.splitlines() if line.rstrip().endswith("]") and "%" in line]
    assert rows == ["floor", "sampling", "usage", "burst_steady", "burst_scaling", "reconcile", "loops_steady",
                    "loops_scaling"], proc.stdout
