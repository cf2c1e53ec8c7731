"""``--baseline NAME=TREE`` of proxy_overhead.py, nri_overhead.py and extender_scale.py
(benchmarks/baseline.py): extender_scale.py runs end to end in a tiny configuration with this
tree as its own baseline, so the option cannot rot; a tree that does not hold the product is
refused before anything starts, since its arm would silently run our code. What is checked is
the plumbing and the table's shape, never a speed. (The other two need a real containerd: their
arm is the same helper plus one wrapped child each.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "extender_scale.py"
ENV = {"PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"}


def test_rounds_alternate_the_order_of_the_arms() -> None:
    sys.path.insert(0, str(REPO))
    from benchmarks.baseline import orders

    assert list(orders(["ours", "old"], 3)) == [(0, ["ours", "old"]), (1, ["old", "ours"]), (2, ["ours", "old"])]


def test_extender_scale_runs_against_a_baseline() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--nodes", "20", "--placed", "40", "--cycles", "8", "--candidates", "20",
         "--rounds", "2", "--no-ha-ledger", "--baseline", f"self={REPO}"],
        capture_output=True, text=True, timeout=600, check=False, env=ENV, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert f"baseline self: scheduler_ext from {REPO}" in out, out
    assert "| measure | ours (median) | self (median) | ratio per round | ratio median [min, max] |" in out, out
    ratio = r"[0-9.]+ [0-9.]+ \| [0-9.]+ \[[0-9.]+, [0-9.]+\]"
    for measure in ("filter p50 ms (sequential)", "full cycle pods/s (pipelined)", "extender RSS MiB"):
        assert re.search(rf"^\| {re.escape(measure)} \| [0-9.]+ \| [0-9.]+ \| {ratio} \|$", out, re.MULTILINE), out


def test_a_tree_without_the_product_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--nodes", "2", "--placed", "2", "--cycles", "2", "--baseline", f"x={tmp_path}"],
        capture_output=True, text=True, timeout=120, check=False, env=ENV, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode != 0
    assert f"--baseline x={tmp_path}: " in proc.stderr, proc.stderr
    assert "would come from" in proc.stderr or "cannot import" in proc.stderr, proc.stderr
    assert "round 1" not in proc.stdout
