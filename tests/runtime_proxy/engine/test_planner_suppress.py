"""``runtime-proxy plan`` shows a CPU suppress decision for a usage snapshot: the example in
``packaging/examples/plan-usage-suppress.json`` (and ``docs/planner.md``) gives the BE kube-QoS
quota Koordinator's formula asks for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime_proxy.commands.plan import main

EXAMPLE = Path(__file__).resolve().parents[3] / "packaging/examples/plan-usage-suppress.json"


def test_the_suppress_example_plans_the_be_quota(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(EXAMPLE), "--no-entry-points", "--output", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 8 CPUs x 65% - LS 3000 - system (4000 - 3500) = 1700 millicores -> 170000 us, a shrink
    # from 400000 written at once; the BE cpusets stay on the whole pool.
    assert out["writes"] == [
        {"level": "kubeqos", "path": "kubepods/besteffort", "file": "cpu.cfs_quota_us", "value": "170000"},
        {"level": "kubeqos", "path": "kubepods/besteffort", "file": "cpuset.cpus", "value": "0-7"},
        {"level": "pod", "path": "kubepods/besteffort/podb1", "file": "cpuset.cpus", "value": "0-7"},
    ]
    assert out["evictions"] == []
