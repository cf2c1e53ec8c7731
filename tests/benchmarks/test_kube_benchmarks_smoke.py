"""The real-cluster benchmarks run end to end in a tiny configuration, so they cannot rot: each
arm and PLEG mode of ``benchmarks/kube_pod_startup.py`` starts one pod, and
``benchmarks/kube_scheduler_throughput.py`` schedules two pods on ten API-only nodes with each
extender (and the profiled run). What is checked is that every arm produced its row, that the
extender's cpusets were exact and disjoint and that kubelet streamed GetContainerEvents without
an error (through the proxy in the proxy arm); never a speed.

The pod-startup benchmark needs the machine's cluster lock (it runs a kubelet), so this file sits
outside ``tests/e2e/``, whose session-wide stack holds that lock until the session ends; in a
whole-suite run it comes before them. Needs root, the kube binary and containerd 2.1, like the
end-to-end tests (``RHP_REQUIRE_KUBE`` turns the skip into a failure).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rhp_devenv.containerd import binaries_for
from rhp_devenv.kube import kube_binary

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"

# a kubelet run waits for any other cluster on this machine to stop first
pytestmark = [pytest.mark.e2e, pytest.mark.requires_root, pytest.mark.timeout(1900)]


def _require(containerd: str | None = None) -> None:
    missing = []
    if kube_binary() is None:
        missing.append("the kube binary (scripts/build-kube.sh)")
    if containerd is not None and binaries_for(containerd).missing():
        missing.append(f"containerd {containerd}")
    if missing:
        reason = f"missing {' and '.join(missing)}; scripts/install-deps.sh installs them"
        if os.environ.get("RHP_REQUIRE_KUBE", "") not in ("", "0"):
            pytest.fail(reason + " (RHP_REQUIRE_KUBE is set)")
        pytest.skip(reason)


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"}
    proc = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          env=env, timeout=1800, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_pod_startup_benchmark_runs_every_arm_in_both_pleg_modes() -> None:
    _require("2.1")
    out = _run("kube_pod_startup.py", "--pods", "1", "--batch", "1", "--warmup", "0")
    for pleg in ("generic", "evented"):
        for arm in ("direct", "proxy", "nri"):
            rows = re.findall(rf"^\| {pleg} \| {arm} \| 1 \| \d+ \| \d+ \|", out, re.MULTILINE)
            assert len(rows) == 2, f"no {pleg}/{arm} rows (to Running, to container started) in:\n{out}"
    assert "every batch streamed GetContainerEvents without an error" in out, out


def test_scheduler_throughput_benchmark_runs_every_extender_and_checks_the_cpusets() -> None:
    _require()
    out = _run("kube_scheduler_throughput.py", "--pods", "2", "--nodes", "10", "--profile", "--arms",
               "none,noop,noop-bind,ours")  # fmt: skip
    for arm in ("none", "noop", "noop-bind", "ours"):
        assert re.search(rf"^\| 10 \| {arm} \| 1 \| \d+ \|", out, re.MULTILINE), f"no row for {arm} in:\n{out}"
    assert "| all 2 exact and disjoint |" in out, out
    assert "Extender profile at 10 nodes" in out, out
