"""The hook runner with in-process plugins: Fail and Ignore policies, timeouts, garbage results,
conflicts, stage CRI fields and facts advanced from step to step."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from hooks import ContainerFacts, NodeFacts, Plan, PodFacts, Resources, hookimpl
from hooks.manager import make_plugin_manager
from runtime_proxy.engine.pipeline import Pipeline, Policy, plugin_steps

_RELEASE = threading.Event()


class Shares:
    def __init__(self, n: int) -> None:
        self.n = n

    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        return Plan().set_resource("cpu_shares", self.n)

    @hookimpl
    def rhp_post_start_container(self) -> Plan:
        return Plan().write("container", "p/c", "cpu.shares", self.n)


class Raises:
    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        raise KeyError("bug")

    @hookimpl
    def rhp_post_start_container(self) -> Plan:
        raise KeyError("bug")


class Hangs:
    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        _RELEASE.wait(5)
        return Plan().set_env("LATE", "1")


class Garbage:
    @hookimpl
    def rhp_pre_create_container(self) -> Any:
        return {"cpu_shares": 1}


class BadResources:
    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        return Plan().set_resource("no_such_field", 1)


class Env:
    @hookimpl
    def rhp_pre_create_container(self, container: ContainerFacts) -> Plan:
        return Plan().set_env("SHARES", str(container.resources.cpu_shares))


def _pipeline(*steps: tuple[object, Policy], timeout: float = 2.0) -> Pipeline:
    pm = make_plugin_manager(builtins=(), entry_points=False)
    settings = []
    for i, (plugin, policy) in enumerate(steps):
        name = f"p{i}-{type(plugin).__name__}"
        pm.register(plugin, name=name)
        settings.append((name, policy, timeout))
    return Pipeline(plugin_steps(pm, settings))


POD = PodFacts(name="p", namespace="ns", uid="u", cgroup_parent="/kubepods/podu", sandbox_id="sb")
CONTAINER = ContainerFacts(name="c", resources=Resources(cpu_shares=512))

# Each row: the steps, then the stage's expected plan CRI, failure kinds, and rejecting step.
POLICIES = [
    pytest.param([(Raises(), "Ignore"), (Shares(3), "Ignore")], {"resources": {"cpu_shares": 3}}, ["error"], None,
                 id="an Ignore step that raises is skipped and the next step runs"),
    pytest.param([(Raises(), "Fail"), (Shares(3), "Ignore")], {}, ["error"], "p0-Raises",
                 id="a Fail step that raises rejects the call and stops the pipeline"),
    pytest.param([(Hangs(), "Ignore"), (Shares(3), "Ignore")], {"resources": {"cpu_shares": 3}}, ["timeout"], None,
                 id="an Ignore step past its timeout is skipped"),
    pytest.param([(Hangs(), "Fail")], {}, ["timeout"], "p0-Hangs",
                 id="a Fail step past its timeout rejects the call"),
    pytest.param([(Garbage(), "Ignore"), (Shares(3), "Ignore")], {"resources": {"cpu_shares": 3}}, ["garbage"], None,
                 id="a step returning something other than a Plan is garbage"),
    pytest.param([(BadResources(), "Fail")], {}, ["garbage"], "p0-BadResources",
                 id="a plan naming an unknown resource is garbage"),
    pytest.param([(Shares(2), "Ignore"), (Shares(3), "Fail")], {"resources": {"cpu_shares": 2}}, ["conflict"],
                 "p1-Shares", id="a Fail step that conflicts rejects the call"),
    pytest.param([(Shares(2), "Ignore"), (Shares(3), "Ignore"), (Env(), "Ignore")],
                 {"resources": {"cpu_shares": 2}, "envs": {"SHARES": "2"}}, ["conflict"], None,
                 id="after an Ignore conflict the next step sees the facts without the loser"),
]


@pytest.mark.parametrize(("steps", "cri", "kinds", "rejected"), POLICIES)
async def test_policies(steps: list[tuple[object, Policy]], cri: dict[str, Any], kinds: list[str],
                        rejected: str | None) -> None:
    _RELEASE.clear()
    try:
        result = await _pipeline(*steps, timeout=0.2).run("PreCreateContainer", POD, CONTAINER, NodeFacts())
    finally:
        _RELEASE.set()
    assert result.plan.cri_json() == cri
    assert [f.kind for f in result.failures] == kinds
    assert (result.rejected.step if result.rejected else None) == rejected


async def test_fail_never_rejects_a_post_stage() -> None:
    result = await _pipeline((Raises(), "Fail"), (Shares(3), "Ignore")).run(
        "PostStartContainer", POD, CONTAINER, NodeFacts()
    )
    assert result.rejected is None
    assert [f.kind for f in result.failures] == ["error"]
    assert [w.value for w in result.plan.writes] == ["3"]


async def test_each_step_sees_the_facts_the_steps_before_it_changed() -> None:
    result = await _pipeline((Shares(2048), "Ignore"), (Env(), "Ignore")).run(
        "PreCreateContainer", POD, CONTAINER, NodeFacts()
    )
    assert result.plan.envs == {"SHARES": "2048"}
    assert result.container is not None and result.container.resources.cpu_shares == 2048


async def test_a_stage_without_steps_gives_an_empty_plan() -> None:
    pipeline = _pipeline((Shares(2), "Fail"))
    assert not pipeline.has_work("PreStopContainer")
    result = await pipeline.run("PreStopContainer", POD, CONTAINER, NodeFacts())
    assert result.plan.is_empty() and result.ran == []


class Where:
    """Records the thread each call ran in."""

    def __init__(self, seen: list[int]) -> None:
        self.seen = seen

    @hookimpl
    def rhp_pre_create_container(self) -> None:
        self.seen.append(threading.get_ident())


async def test_the_in_process_steps_of_a_stage_run_in_one_worker_thread_off_the_event_loop() -> None:
    seen: list[int] = []
    await _pipeline((Where(seen), "Ignore"), (Where(seen), "Ignore"), (Where(seen), "Ignore")).run(
        "PreCreateContainer", POD, CONTAINER, NodeFacts()
    )
    assert len(seen) == 3 and len(set(seen)) == 1
    assert seen[0] != threading.get_ident()


async def test_a_step_that_hangs_mid_stage_is_skipped_and_what_it_returns_later_is_dropped() -> None:
    _RELEASE.clear()
    try:
        result = await _pipeline((Shares(2), "Ignore"), (Hangs(), "Ignore"), (Env(), "Ignore"), timeout=0.2).run(
            "PreCreateContainer", POD, CONTAINER, NodeFacts()
        )
    finally:
        _RELEASE.set()
    assert result.ran == ["p0-Shares", "p1-Hangs", "p2-Env"]
    assert [f.kind for f in result.failures] == ["timeout"]
    assert result.plan.cri_json() == {"resources": {"cpu_shares": 2}, "envs": {"SHARES": "2"}}
    await asyncio.sleep(0.05)  # the hung step has returned by now: nothing of it arrives
    assert result.plan.envs == {"SHARES": "2"}
    assert result.container is not None and "LATE" not in result.container.envs
