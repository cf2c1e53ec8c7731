"""One hook runner: ``runtime-proxy plan`` and the running proxy give the same plan for the same
facts, because both run ``Pipeline.run``; and the stage table comes from ``hooks.spec``.

Each case runs twice: through ``plan_document`` (the planner) and through the interceptor with
the same in-process plugins (the running proxy's path, request in, rewritten request out).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import pytest

from cri_protos import api_pb2
from hooks import ContainerFacts, Plan, PodFacts, hookimpl
from hooks.manager import make_plugin_manager, plugin_order
from hooks.plugins import BUILTIN_PLUGINS
from hooks.spec import CRI_FIELDS, STAGES
from runtime_proxy.cri.door import CriInterceptor
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.engine.planner import plan_document
from runtime_proxy.runtime.client import RuntimeClient
from runtime_proxy.state.store import Store

DOCS = Path(__file__).resolve().parents[3] / "docs" / "planner.md"


class DoubleShares:
    """Sets cpu_shares to twice what it sees."""

    @hookimpl
    def rhp_pre_create_container(self, container: ContainerFacts) -> Plan:
        return Plan().set_resource("cpu_shares", container.resources.cpu_shares * 2)


class QuotaFromShares:
    """Reads the shares the plugin before it set, and derives the quota and an env from them."""

    @hookimpl
    def rhp_pre_create_container(self, container: ContainerFacts) -> Plan:
        shares = container.resources.cpu_shares
        return Plan().set_resource("cpu_quota", shares * 100).set_env("SEEN_SHARES", str(shares))


class MovesCgroupParent:
    """Sets the cgroup parent at PreCreateContainer (the stage may change it)."""

    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts) -> Plan:
        return Plan().set_cgroup_parent(pod.cgroup_parent + "/moved").set_annotation("moved", "yes")


class LabelsAtCreate:
    """Sets a label at PreCreateContainer, which that stage cannot change."""

    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        return Plan().set_label("x", "y").set_env("LABELLED", "tried")


class ConflictingShares:
    """Wants shares that differ from DoubleShares': a conflict, its whole plan left out."""

    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        return Plan().set_resource("cpu_shares", 7).set_env("NEVER", "applied")


class Raises:
    @hookimpl
    def rhp_pre_create_container(self) -> Plan:
        raise RuntimeError("plugin bug")


# Each row: the plugins in order, and what the plan must hold (checked on both paths).
CASES = [
    pytest.param([DoubleShares(), QuotaFromShares()],
                 {"resources": {"cpu_shares": 1024, "cpu_quota": 102400}, "envs": {"SEEN_SHARES": "1024"}},
                 id="the second plugin reads the shares the first one set"),
    pytest.param([QuotaFromShares(), DoubleShares()],
                 {"resources": {"cpu_quota": 51200, "cpu_shares": 1024}, "envs": {"SEEN_SHARES": "512"}},
                 id="in the other order the quota comes from the request's shares"),
    pytest.param([MovesCgroupParent()],
                 {"cgroupParent": "/kubepods/burstable/podu1/moved", "annotations": {"moved": "yes"}},
                 id="the cgroup parent may change at PreCreateContainer"),
    pytest.param([LabelsAtCreate()], {"envs": {"LABELLED": "tried"}},
                 id="labels are dropped at PreCreateContainer, the rest of the plan stays"),
    pytest.param([DoubleShares(), ConflictingShares()], {"resources": {"cpu_shares": 1024}},
                 id="a conflicting plugin contributes nothing"),
    pytest.param([Raises(), DoubleShares()], {"resources": {"cpu_shares": 1024}},
                 id="a plugin that raises is skipped under Ignore and the next one runs"),
]

POD: dict[str, Any] = {
    "name": "p", "namespace": "ns", "uid": "u1", "labels": {}, "cgroupParent": "/kubepods/burstable/podu1"
}
CONTAINER = {"name": "c", "resources": {"cpu_shares": 512}}


def _manager(plugins: list[object]) -> Any:
    """A manager with ``plugins`` registered as ``p0-Name``, ``p1-Name``... (so in list order)."""
    pm = make_plugin_manager(builtins=(), entry_points=False)
    for i, plugin in enumerate(plugins):
        pm.register(plugin, name=f"p{i}-{type(plugin).__name__}")
    return pm


async def _through_the_proxy(plugins: list[object]) -> dict[str, Any]:
    """The CRI changes the interceptor makes to a CreateContainer request, as planner JSON."""
    pm = _manager(plugins)
    pipeline = Pipeline(plugin_steps(pm, [(n, "Ignore", 2.0) for n in plugin_order(pm)]))
    store = Store()
    store.put_pod(PodFacts(name="p", namespace="ns", uid="u1", cgroup_parent=POD["cgroupParent"], sandbox_id="sb"))
    # the pod is stored, so the runtime client is never asked
    icpt = CriInterceptor(store=store, pipeline=pipeline, client=cast(RuntimeClient, None))
    req = api_pb2.CreateContainerRequest(pod_sandbox_id="sb")
    req.config.metadata.name = "c"
    req.config.linux.resources.cpu_shares = 512
    req.sandbox_config.metadata.name = "p"
    req.sandbox_config.metadata.namespace = "ns"
    req.sandbox_config.metadata.uid = "u1"
    req.sandbox_config.linux.cgroup_parent = POD["cgroupParent"]
    before = api_pb2.CreateContainerRequest()
    before.CopyFrom(req)
    sent = api_pb2.CreateContainerRequest.FromString(
        (await icpt.before("/runtime.v1.RuntimeService/CreateContainer", req.SerializeToString())).request
    )
    out: dict[str, Any] = {}
    resources = {
        f.name: value for f, value in sent.config.linux.resources.ListFields()
        if getattr(before.config.linux.resources, f.name) != value
    }
    if resources:
        out["resources"] = resources
    envs = {kv.key: kv.value for kv in sent.config.envs}
    if envs:
        out["envs"] = envs
    if sent.config.annotations:
        out["annotations"] = dict(sent.config.annotations)
    if sent.sandbox_config.linux.cgroup_parent != before.sandbox_config.linux.cgroup_parent:
        out["cgroupParent"] = sent.sandbox_config.linux.cgroup_parent
    return out


@pytest.mark.parametrize(("plugins", "expected"), CASES)
async def test_planner_and_proxy_give_the_same_plan(plugins: list[object], expected: dict[str, Any]) -> None:
    document = {"stage": "PreCreateContainer", "pod": POD, "container": CONTAINER}
    planned = await _in_thread(lambda: plan_document(document, pm=_manager(plugins)))
    assert planned["cri"] == expected
    assert await _through_the_proxy(plugins) == expected


async def _in_thread(fn: Any) -> Any:
    # plan_document runs its own event loop, so it runs beside this test's loop
    import asyncio

    return await asyncio.to_thread(fn)


def test_dropped_fields_and_failures_are_listed_as_skipped() -> None:
    document = {"stage": "PreCreateContainer", "pod": POD, "container": CONTAINER}
    out = plan_document(document, pm=_manager([Raises(), LabelsAtCreate(), DoubleShares(), ConflictingShares()]))
    skipped = {(s["plugin"], s["reason"].split(":")[0]) for s in out["skipped"]}
    assert ("p0-Raises", "error") in skipped
    assert ("p1-LabelsAtCreate", "stage PreCreateContainer cannot change cri.labels") in skipped
    assert ("p3-ConflictingShares", "conflict") in skipped
    assert out["conflicts"] == [
        {"field": "resources.cpu_shares", "plugins": ["p2-DoubleShares", "p3-ConflictingShares"], "values": [1024, 7]}
    ]


def test_the_stage_table_comes_from_the_specs() -> None:
    assert set(CRI_FIELDS) == set(STAGES)
    changing = {stage: fields for stage, fields in CRI_FIELDS.items() if fields}
    assert changing == {
        "PreRunPodSandbox": {"labels", "annotations", "cgroup_parent"},
        "PreCreateContainer": {"resources", "envs", "annotations", "cgroup_parent"},
        "PreUpdateContainerResources": {"resources", "annotations"},
        "ReconcileContainer": {"resources"},
    }


def test_docs_list_the_stage_table() -> None:
    """docs/planner.md's table of what each stage may change is the one in hooks.spec."""
    text = DOCS.read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]*) \|$", text, flags=re.MULTILINE))
    documented = {stage: set(re.findall(r"`(\w+)`", cells)) for stage, cells in rows.items() if stage in STAGES}
    assert documented == {stage: set(fields) for stage, fields in CRI_FIELDS.items() if fields}


def test_docs_list_every_builtin_plugin_in_order() -> None:
    """docs/planner.md names the default plugin order twice (the `plugins` row of the input table
    and the example output of plan-ls-create.json); both are BUILTIN_PLUGINS and what the
    planner prints for that example, so a new built-in cannot be left out of the docs."""
    text = DOCS.read_text()
    row = re.search(r"built-ins in `BUILTIN_PLUGINS` order: ([^;]*);", text)
    assert row is not None
    example = re.search(r'\{"stage": "PreCreateContainer", "plugins": (\[[^\]]*\])', text)
    assert example is not None
    example_doc = json.loads((DOCS.parents[1] / "packaging" / "examples" / "plan-ls-create.json").read_text())
    printed = plan_document(example_doc)["plugins"]
    assert re.findall(r"`(\w+)`", row.group(1)) == list(BUILTIN_PLUGINS) == printed
    assert json.loads(example.group(1)) == printed


def test_planner_output_is_json() -> None:
    document = {"stage": "PreCreateContainer", "pod": POD, "container": CONTAINER}
    json.dumps(plan_document(document, pm=_manager([DoubleShares()])))
