"""``benchmarks/report_cost.py`` runs end to end in a tiny configuration (2 pods, 12 simulated
seconds, a report every 5 s), so it cannot rot; what is checked is that it printed its three
rows, never a speed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_report_cost_benchmark_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "report_cost.py"), "--pods", "1", "--seconds", "12",
         "--report-interval", "5"],
        capture_output=True, text=True, timeout=300, check=False, env={"PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line for line in proc.stdout.splitlines() if "% of one core" in line]
    assert len(rows) == 3, proc.stdout
