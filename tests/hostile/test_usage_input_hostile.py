"""The planner's ``usage`` input under attack: every malformed, oversized or deep value is one
clear error naming its path (``PlanInputError`` in-process, exit code 2 and one stderr line from
the command), never a traceback, a hang or a partial plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hooks.usage import MAX_SAMPLES
from runtime_proxy.engine.planner import PlanInputError, plan_document
from runtime_proxy.engine.usage_input import MAX_ENTRIES, MAX_EVICTIONS, MAX_TOTAL_ENTRIES

REPO = Path(__file__).resolve().parents[2]


def sample(**extra: Any) -> dict[str, Any]:
    return {"at": 1, **extra}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"x": value}
    return value


HOSTILE = [
    pytest.param([], "must be an object", id="usage that is a list"),
    pytest.param("samples", "must be an object", id="usage that is a string"),
    pytest.param({"samplez": []}, "unknown key", id="a misspelt top-level key"),
    pytest.param({"samples": {}}, "must be a list", id="samples that are an object"),
    pytest.param({"samples": [sample()] * (MAX_SAMPLES + 1)}, "more than the 600 allowed",
                 id="more samples than the longest window"),
    pytest.param({"samples": [{}]}, "at is required", id="a sample without its time"),
    pytest.param({"samples": [sample(at="now")]}, "must be a number", id="a time that is a string"),
    pytest.param({"samples": [sample(at=1e300)]}, "finite number", id="a time far out of range"),
    pytest.param({"samples": [sample(at=2), sample(at=1)]}, "oldest first", id="samples out of time order"),
    pytest.param({"samples": [sample(nodeCpuMilli=-1)]}, "must be in 0..", id="a negative node CPU"),
    pytest.param({"samples": [sample(nodeCpuMilli=1.5)]}, "must be an integer", id="a fractional CPU"),
    pytest.param({"samples": [sample(nodeCpuMilli=True)]}, "must be an integer", id="a boolean CPU"),
    pytest.param({"samples": [sample(nodeMemoryUsedBytes=1 << 63)]}, "must be in 0..",
                 id="memory above the int64 range"),
    pytest.param({"samples": [sample(nodeCpuMilli=1, node_cpu_milli=2)]}, "given twice",
                 id="one field in both spellings"),
    pytest.param({"samples": [sample(pods=[])]}, "must be an object", id="pods that are a list"),
    pytest.param({"samples": [sample(pods={"": {}})]}, "non-empty string", id="a pod with an empty uid"),
    pytest.param({"samples": [sample(pods={"u" * 300: {}})]}, "at most 253", id="a pod uid of 300 characters"),
    pytest.param({"samples": [sample(pods={"a": {"cpuMilli": "5"}})]}, "must be an integer",
                 id="a pod CPU that is a string"),
    pytest.param({"samples": [sample(pods={"a": {"cpu": 5}})]}, "unknown key", id="a pod entry with an unknown key"),
    pytest.param({"samples": [sample(pods={"a": 5})]}, "must be an object", id="a pod entry that is a number"),
    pytest.param({"samples": [sample(pods={str(i): {} for i in range(MAX_ENTRIES + 1)})]}, "more than the",
                 id="more pods in one sample than any node runs"),
    pytest.param({"samples": [sample(at=i, containers={str(j): {} for j in range(MAX_ENTRIES)})
                              for i in range(MAX_TOTAL_ENTRIES // MAX_ENTRIES + 1)]},
                 "more than 200000", id="more entries over all samples than the total bound"),
    pytest.param({"samples": [sample(be={"cpuset": "0-99999999"})]}, "be.cpuset", id="a BE cpuset naming huge ids"),
    pytest.param({"samples": [sample(be={"cpuset": [0, 1]})]}, "CPU list string", id="a BE cpuset that is a list"),
    pytest.param({"samples": [sample(be={"cfsQuotaUs": -2})]}, "must be in -1..", id="a BE quota below unlimited"),
    pytest.param({"samples": [sample(be={"cfsPeriodUs": 0})]}, "must be in 1000..", id="a BE period of zero"),
    pytest.param({"samples": [sample(be=nested(20))]}, "unknown key", id="a deeply nested BE state"),
    pytest.param({"recentEvictions": [{"uid": "a", "feature": "X"}] * (MAX_EVICTIONS + 1)}, "more than the",
                 id="more remembered evictions than the bound"),
    pytest.param({"recentEvictions": [{"uid": "a", "feature": "X"}]}, "at is required",
                 id="a remembered eviction without its time"),
    pytest.param({"recentEvictions": [{"uid": 5, "feature": "X", "at": 1}]}, "uid must be",
                 id="a remembered eviction with a numeric uid"),
    pytest.param({"interval": 0}, "interval", id="an interval of zero"),
]


@pytest.mark.parametrize(("usage", "message"), HOSTILE)
def test_hostile_usage_input_is_one_clear_error(usage: Any, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(PlanInputError) as info:
        plan_document({"stage": "ReconcileUsage", "usage": usage})
    assert message in str(info.value)
    assert str(info.value).startswith("usage") or "usage" in str(info.value)
    assert len(str(info.value)) < 400, "the error is one readable line"
    assert time.perf_counter() - started < 30


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param({"stage": "ReconcileUsage", "pods": {"a": 1}}, id="pods that are an object"),
        pytest.param({"stage": "ReconcileUsage", "pods": [{"uid": 5}]}, id="a pod whose uid is a number"),
        pytest.param({"stage": "ReconcileUsage", "pods": [{"podName": "x"}]}, id="a pod with an unknown key"),
        pytest.param({"stage": "ReconcileUsage", "pods": [{}] * 5000}, id="more pods than the bound"),
        pytest.param({"stage": "ReconcileUsage", "pods": [{"priority": "high"}]}, id="a priority that is a string"),
    ],
)
def test_hostile_pods_input_is_one_clear_error(doc: dict[str, Any]) -> None:
    with pytest.raises(PlanInputError):
        plan_document(doc)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        pytest.param('{"stage":"ReconcileUsage","usage":{"samples":[{"at":1,"nodeCpuMilli":' + "9" * 30 + "}]}}",
                     "more than 19 digits", id="a thirty-digit number in a sample"),
        pytest.param('{"stage":"ReconcileUsage","usage":' + '{"samples":[' * 40 + "]}" * 40 + "}",
                     "nested", id="samples nested forty deep"),
        pytest.param('{"stage":"ReconcileUsage","usage":{"samples":[{"at":NaN}]}}', "NaN",
                     id="a NaN time"),
    ],
)
def test_the_command_refuses_hostile_usage_with_exit_code_2(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "doc.json"
    path.write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "runtime_proxy.cli", "plan", "--no-entry-points", str(path)],
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("runtime-proxy plan:")
    assert needle.lower() in lines[0].lower() or "json" in lines[0].lower()
    assert "Traceback" not in proc.stderr


def test_a_large_valid_usage_window_is_planned(tmp_path: Path) -> None:
    """The longest window with a hundred pods each is within every bound and decodes."""
    samples = [sample(at=i, pods={f"p{j}": {"cpuMilli": j, "memoryBytes": j} for j in range(100)})
               for i in range(MAX_SAMPLES)]
    out = plan_document({"stage": "ReconcileUsage", "usage": {"samples": samples}})
    assert out["evictions"] == []
    assert len(json.dumps(samples)) < 4 * 1024 * 1024
