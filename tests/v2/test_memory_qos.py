"""Memory QoS under real memory pressure on the cgroup v2 guest (issue 33, item 4).

``guest_memory_qos.py`` runs in the guest: ``runtime-proxy serve`` with ``memory_qos`` starts an
LS pod (memory request 256 MiB) and a BE pod; kubepods.slice is limited to 384 MiB, as kubelet's
allocatable enforcement does. The LS container's working set is 160 MiB of page cache; a BE
process then writes 288 MiB of anonymous memory. Without memory QoS (``enable: false``, memory.min
0) the kernel reclaims the LS working set to make room, and the LS container reads it from disk
again; with it (``minLimitPercent: 100``, memory.min 256 MiB on the LS container, pod,
burstable slice and kubepods.slice) the LS working set stays and the BE process is what the
kernel's OOM killer ends. The numbers go to the tier's summary (and docs/v2-node.md).
On the old main there was no memory_qos plugin: the second phase finds memory.min 0 and fails.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rhp_devenv.v2node import GUEST_SHARE, Result, V2Node

from tests.v2.conftest import REPO
from tests.v2.report import REPORT

MiB = 1024**2


def _mib(value: int) -> str:
    return f"{value / MiB:.0f} MiB"


def _lines(phase: dict[str, Any]) -> list[str]:
    before, after = phase["ls_before"], phase["ls_after"]
    return [
        f"memory QoS, {phase['phase']}:",
        f"  LS memory.min {phase['ls_min']}, burstable slice {phase['burstable_min']},"
        f" kubepods {phase['kubepods_min']}",
        f"  LS working set read in {phase['first_read']['seconds']} s;"
        f" LS memory.current {_mib(before['memory.current'])} (file {_mib(before['file'])}) before the BE pressure,"
        f" {_mib(after['memory.current'])}"
        f" (file {_mib(after['file'])}) after",
        f"  BE process: exit {phase['be_rc']} after {phase['be_seconds']} s; OOM kills in kubepods.slice:"
        f" {phase['kubepods_oom_kills']}; LS memory.events change {phase['ls_events_delta']}",
        f"  LS re-read: {phase['second_read']['seconds']} s, {phase['second_read']['read_in_mib']} MiB read in again,"
        f" {phase['second_read']['refaults']} refaults",
    ]


@pytest.fixture(scope="module")
def guest_run(v2node: V2Node) -> tuple[Result, Path]:
    """One guest run for both tests of this module (either may run alone): its result and the
    JSON file it writes."""
    out = f"{GUEST_SHARE}/out"
    result = v2node.run(v2node.python(str(REPO / "tests" / "v2" / "guest_memory_qos.py"), out), timeout=1000)
    return result, v2node.share / "out" / "memory_qos.json"


def _finished(run: tuple[Result, Path]) -> Path:
    result, path = run
    assert result.rc == 0 and path.exists(), f"guest run failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return path


def test_ls_working_set_survives_be_pressure(guest_run: tuple[Result, Path]) -> None:
    path = _finished(guest_run)
    data = json.loads(path.read_text())
    off, on = data["phases"]
    lines = [line for phase in (off, on) for line in _lines(phase)]
    lines.append(f"memory QoS guest run: {data['seconds']} s (seconds from its start: {data['timings']})")
    REPORT.extend(lines)
    print("\n".join(lines))
    log = "\n--- log ---\n" + data["log"][-4000:]
    # the plugin's writes, read back from the kernel
    assert off["ls_min"] == "0" and off["burstable_min"] == "0", log
    assert on["ls_min"] == on["burstable_min"] == on["kubepods_min"] == str(256 * MiB), log
    # without protection the BE pressure takes LS's page cache (BE needs 64 MiB more than is free)
    assert off["ls_after"]["file"] < off["ls_before"]["file"] - 32 * MiB, lines
    assert off["second_read"]["read_in_mib"] > 32, lines
    assert off["be_rc"] == 0, lines
    # with memory.min the LS working set stays; the BE process is what gives
    assert on["ls_after"]["file"] >= on["ls_before"]["file"] - 4 * MiB, lines
    assert on["second_read"]["read_in_mib"] < 8, lines
    assert on["be_rc"] != 0 and on["kubepods_oom_kills"] >= 1, lines


def test_a_pod_with_its_own_memory_qos_gets_its_own_values(guest_run: tuple[Result, Path]) -> None:
    """The third pod of the guest run above carries ``koordinator.sh/memoryQOS`` (policy auto,
    minLimitPercent 0, lowLimitPercent 50, throttlingPercent 50, request 64 MiB, limit 128 MiB):
    its container reads back its own memory.min/low/high under both NodeSLOs, the one that
    disables lsClass and the one that gives lsClass 100 % (64 MiB of memory.min without the
    annotation). On the old main the annotation was not read: 0, 0 and max, then 64 MiB."""
    path = _finished(guest_run)
    own = json.loads(path.read_text())["own"]
    lines = [f"memory QoS, pod annotation {json.dumps(own['annotation'])}: planned {own['expected']}"]
    lines += [f"  read back from its container's files under {r['phase']}: "
              f"{ {k: v for k, v in r.items() if k != 'phase'} }" for r in own["read"]]
    REPORT.extend(lines)
    print("\n".join(lines))
    assert len(own["read"]) == 2, own
    for read in own["read"]:
        assert {k: v for k, v in read.items() if k != "phase"} == own["expected"], lines
