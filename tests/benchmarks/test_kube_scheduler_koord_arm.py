"""The koord-scheduler arm of ``benchmarks/kube_scheduler_throughput.py``: koord-scheduler v1.8.0
(built by ``scripts/build-koord.sh koord-scheduler``, which CI does not run: the real-cluster test
here skips there, saying so) places LSR pods on API-only nodes with NodeResourceTopology, and its
cpusets are checked exact and disjoint like ours. Without the binary the benchmark says why it
skipped the arm and measures the others. What is checked is the plumbing, never a speed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from rhp_devenv.kube import kube_binary

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "kube_scheduler_throughput.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kube_scheduler_throughput_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_binary_skips_the_arm_with_the_reason(tmp_path: Path) -> None:
    binary, why = _load().koord_binary(str(tmp_path / "koord-scheduler"))
    assert binary is None
    assert why == f"no binary at {tmp_path / 'koord-scheduler'} (bash scripts/build-koord.sh koord-scheduler builds it)"


def test_the_configuration_turns_on_numa_cpusets_and_leaves_reservation_off(tmp_path: Path) -> None:
    config = _load().koord_config(tmp_path / "kubeconfig", 5000)
    (profile,) = config["profiles"]
    assert profile["schedulerName"] == "default-scheduler"  # the pods name no scheduler
    plugins = profile["plugins"]
    for point in ("preFilter", "filter", "score", "reserve", "preBind"):
        assert any(p["name"] == "NodeNUMAResource" for p in plugins[point]["enabled"]), point
    enabled = {p["name"] for point in plugins.values() for p in point.get("enabled", [])}
    assert enabled == {"NodeNUMAResource", "DefaultPreBind"}
    assert config["leaderElection"] == {"leaderElect": False}


def _koord_or_skip() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root (the cluster's processes)")
    if kube_binary() is None:
        reason = "missing the kube binary (scripts/build-kube.sh); scripts/install-deps.sh installs it"
        if os.environ.get("RHP_REQUIRE_KUBE", "") not in ("", "0"):
            pytest.fail(reason + " (RHP_REQUIRE_KUBE is set)")
        pytest.skip(reason)
    binary, why = _load().koord_binary(None)
    if binary is None:
        # CI does not build Koordinator (minutes of go build): this arm is measured by hand
        pytest.skip(f"koord-scheduler is not built: {why}")
    return str(binary)


@pytest.mark.e2e
@pytest.mark.requires_root
@pytest.mark.timeout(900)
def test_koord_scheduler_places_lsr_pods_with_exact_disjoint_cpusets() -> None:
    binary = _koord_or_skip()
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--pods", "3", "--nodes", "4", "--arms", "noop,koord",
                           "--koord-scheduler", binary, "--timeout", "300"],
                          capture_output=True, text=True, env=env, timeout=840, stdin=subprocess.DEVNULL,
                          check=False)  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{out[-3000:]}\n{proc.stderr[-5000:]}"
    row = r"^\| 4 \| koord \| 1 \| \d+ \| [0-9.]+ \| .* \| all 3 exact and disjoint \|$"
    assert re.search(row, out, re.MULTILINE), out
    assert re.search(r"^\| 4 \| koord \| 1 \| \d+ \[\d+, \d+\] \| [0-9.]+ \[", out, re.MULTILINE), out
    assert "koord-scheduler could not list" not in proc.stderr, proc.stderr[-3000:]  # no API it could not list


@pytest.mark.requires_root
@pytest.mark.timeout(900)
def test_without_the_binary_the_benchmark_skips_the_arm_and_measures_the_others(tmp_path: Path) -> None:
    if os.geteuid() != 0 or kube_binary() is None:
        pytest.skip("needs root and the kube binary (scripts/install-deps.sh)")
    absent = tmp_path / "koord-scheduler"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--pods", "2", "--nodes", "3", "--arms", "none,koord",
                           "--koord-scheduler", str(absent)],
                          capture_output=True, text=True, env=env, timeout=840, stdin=subprocess.DEVNULL,
                          check=False)  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{out[-3000:]}\n{proc.stderr[-5000:]}"
    assert f"koord-scheduler arm skipped: no binary at {absent}" in out, out
    assert re.search(r"^\| 3 \| none \| 1 \| \d+ \|", out, re.MULTILINE), out
    assert "| koord |" not in out, out
