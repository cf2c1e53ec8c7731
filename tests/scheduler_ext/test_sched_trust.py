"""Who may write the scheduler-owned annotations (issue 23, items 1 to 3), through the HTTP
verbs against the fake API server:

1. a forged allocation counts for nothing, and bind always writes or removes every owned
   annotation; the extender's own binds still count after a restart (their signature), and
   after a change of key (issue 37 item 2);
2. a stale cpuset left by a replica that died mid-bind never survives the next bind;
3. a silent watch is dropped and listed again, makes ``/readyz`` fail and binds refused, and
   an expired HA-ledger entry stays until the replica's watch has settled it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import pytest

from koord_formats.topology import format_cpu_topology
from scheduler_ext.extender import Binder, ExtenderConfig
from scheduler_ext.ledger import LeaseLedger
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.trust import LEGACY_SEAL_ANNOTATION, SIGNATURE_ANNOTATION, Signer, Trust
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import TOPO_QUAD_NUMA, cluster, cpus, pod
from tests.scheduler_ext.conftest import SIGNER, TRUST, Extender, bind_client, start_extender, wait_for

RS = "scheduling.koordinator.sh/resource-status"
DA = "scheduling.koordinator.sh/device-allocated"
RA = "scheduling.koordinator.sh/reservation-allocated"
FORGED = {RS: json.dumps({"cpuset": "0-15"}),
          DA: json.dumps({"gpu": [{"minor": 0, "resources": {"koordinator.sh/gpu-core": "100"}}]}),
          RA: json.dumps({"name": "r", "uid": "uid-r"})}


def bind(ext: Extender, p: Mapping[str, Any], node_name: str) -> str:
    body = {"PodName": p["metadata"]["name"], "PodNamespace": p["metadata"]["namespace"],
            "PodUID": p["metadata"]["uid"], "Node": node_name}
    return str(httpx.post(f"{ext.url}/bind", json=body, timeout=10).json()["Error"])


def passes(ext: Extender, p: Mapping[str, Any], node_name: str) -> bool:
    reply = httpx.post(f"{ext.url}/filter", json={"Pod": p, "NodeNames": [node_name]}, timeout=10).json()
    return node_name in (reply["NodeNames"] or [])


def annotations(api: FakeAPIServer, name: str) -> dict[str, str]:
    got = api.get("pods", name, "default")
    assert got is not None
    return dict(got["metadata"]["annotations"])


# -- 1. forged allocations ----------------------------------------------------------------------


def test_a_forged_cpuset_on_a_pod_created_with_node_name_counts_for_nothing(
    api: FakeAPIServer, serve: Callable[..., Extender]
) -> None:
    """The pod bypassed every scheduler (``spec.nodeName`` at create) with a cpuset naming the
    whole node; the next LSR pod still gets the node's CPUs (on main it was refused)."""
    forged = pod("tenant", cpu="1", qos="LS", node_name="n1", scheduler_name="default-scheduler",
                 annotations={RS: json.dumps({"cpuset": "0-15"})})
    ext = serve([*cluster(["n1"]), forged])
    wait_for(lambda: forged["metadata"]["uid"] in ext.state.pods)
    victim = pod("lsr", cpu="16")
    api.create(victim)
    wait_for(lambda: ext.state.pending(victim["metadata"]["uid"]) is not None)
    assert passes(ext, victim, "n1")
    assert bind(ext, victim, "n1") == ""
    assert ext.state.nodes["n1"].allocs.keys() == {victim["metadata"]["uid"]}


def test_a_forged_cpuset_with_a_copied_signature_counts_for_nothing(
    api: FakeAPIServer, serve: Callable[..., Extender]
) -> None:
    """A signature names its pod's UID, name and node: copied onto another pod, it does not verify."""
    ext = serve(cluster(["n1"]))
    real = pod("real", cpu="4")
    api.create(real)
    wait_for(lambda: ext.state.pending(real["metadata"]["uid"]) is not None)
    assert bind(ext, real, "n1") == ""
    theirs = annotations(api, "real")
    copy = pod("copy", cpu="1", qos="LS", node_name="n1", scheduler_name="default-scheduler",
               annotations={RS: json.dumps({"cpuset": "4-15"}), SIGNATURE_ANNOTATION: theirs[SIGNATURE_ANNOTATION]})
    api.create(copy)
    wait_for(lambda: copy["metadata"]["uid"] in ext.state.pods)
    assert ext.state.nodes["n1"].allocs.keys() == {real["metadata"]["uid"]}
    assert ext.state.pods[copy["metadata"]["uid"]].bad == "untrusted (signature does not verify)"


@pytest.mark.parametrize(
    ("qos", "cpu"),
    [("LS", "1500m"), ("BE", "1"), ("LSR", "4")],
    ids=["an LS pod without a cpuset", "a BE pod", "an LSR pod given its own cpuset"],
)
def test_bind_removes_every_forged_owned_annotation(
    api: FakeAPIServer, serve: Callable[..., Extender], qos: str, cpu: str
) -> None:
    """Whatever the pod's creator wrote, after bind the pod carries only what the bind wrote
    (on main an LS pod kept a forged ``{"cpuset":"0-15"}``)."""
    p = pod("web", cpu=cpu, qos=qos, priority=None if qos == "BE" else 9000, annotations=dict(FORGED))
    ext = serve([*cluster(["n1"]), p])
    wait_for(lambda: ext.state.pending(p["metadata"]["uid"]) is not None)
    assert bind(ext, p, "n1") == ""
    got = annotations(api, "web")
    assert DA not in got and RA not in got and SIGNATURE_ANNOTATION in got
    if qos == "LSR":
        assert json.loads(got[RS])["cpuset"] != "0-15" and len(cpus(json.loads(got[RS])["cpuset"])) == 4
    else:
        assert RS not in got
    uid = p["metadata"]["uid"]
    wait_for(lambda: ext.state.pods[uid].node == "n1" and ext.state.held_count() == 0)
    assert ext.state.pods[uid].bad == ""  # its own signature verifies


def test_the_extender_s_own_binds_still_count_after_a_restart(
    api: FakeAPIServer, serve: Callable[..., Extender]
) -> None:
    first = serve(cluster(["n1"]))
    mine = pod("mine", cpu="8")
    api.create(mine)
    wait_for(lambda: first.state.pending(mine["metadata"]["uid"]) is not None)
    assert bind(first, mine, "n1") == ""
    first.stop()
    second = serve()  # a new process: it knows only what the cluster says
    assert second.state.nodes["n1"].allocs[mine["metadata"]["uid"]].cpus == cpus(
        json.loads(annotations(api, "mine")[RS])["cpuset"])
    other = pod("other", cpu="16")  # 16 CPUs: only 8 are left
    assert not passes(second, other, "n1")
    # a new key that never signed it (the Secret replaced, the old public key dropped): the
    # placed pod's CPUs stay counted, so a new pod cannot get them
    stranger = serve(trust=Trust.of(Signer.generate(), []))
    assert stranger.state.nodes["n1"].allocs[mine["metadata"]["uid"]].cpus == cpus(
        json.loads(annotations(api, "mine")[RS])["cpuset"])
    assert not passes(stranger, other, "n1")


@pytest.mark.parametrize(
    "proof",
    [
        pytest.param({SIGNATURE_ANNOTATION: "v1.0123456789abcdef.16000." + "A" * 86}, id="an unknown key's signature"),
        pytest.param({LEGACY_SEAL_ANNOTATION: "v1.abc"}, id="an earlier release's seal"),
    ],
)
def test_an_unverifiable_allocation_counts_only_within_its_pod_s_request(
    serve: Callable[..., Extender], proof: dict[str, str]
) -> None:
    """Counted, not trusted (issue 37 item 2): a placed pod whose signature no key of the
    extender can check keeps its CPUs counted when they are within its own CPU request; a claim
    larger than the request counts for nothing (else a tenant could fence off a whole node)."""
    within = pod("within", cpu="2", node_name="n1", scheduler_name="default-scheduler",
                 annotations={RS: json.dumps({"cpuset": "0-1"}), **proof})
    beyond = pod("beyond", cpu="1", node_name="n1", scheduler_name="default-scheduler",
                 annotations={RS: json.dumps({"cpuset": "2-15"}), **proof})
    ext = serve([*cluster(["n1"]), within, beyond])
    wait_for(lambda: {within["metadata"]["uid"], beyond["metadata"]["uid"]} <= ext.state.pods.keys())
    assert ext.state.nodes["n1"].allocs.keys() == {within["metadata"]["uid"]}
    assert ext.state.nodes["n1"].allocs[within["metadata"]["uid"]].cpus == {0, 1}


def test_a_tenant_s_later_edit_of_a_signed_allocation_keeps_what_the_extender_gave(
    api: FakeAPIServer, serve: Callable[..., Extender]
) -> None:
    ext = serve(cluster(["n1"]))
    p = pod("web", cpu="4")
    api.create(p)
    wait_for(lambda: ext.state.pending(p["metadata"]["uid"]) is not None)
    assert bind(ext, p, "n1") == ""
    given = cpus(json.loads(annotations(api, "web")[RS])["cpuset"])
    wait_for(lambda: ext.state.nodes["n1"].allocs.get(p["metadata"]["uid"]) is not None
             and ext.state.held_count() == 0)
    api.patch_direct("pods", "web", {"metadata": {"annotations": {RS: json.dumps({"cpuset": "0-15"})}}}, "default")
    wait_for(lambda: ext.state.pods[p["metadata"]["uid"]].bad.startswith("untrusted"))
    assert ext.state.nodes["n1"].allocs[p["metadata"]["uid"]].cpus == given


@pytest.mark.parametrize(
    ("names", "counted"),
    [("koord-scheduler", True), ("", False)],
    ids=["koord-scheduler is trusted by default", "no scheduler trusted: its pods count for nothing"],
)
def test_pods_placed_by_a_trusted_scheduler_count_unsigned(
    serve: Callable[..., Extender], names: str, counted: bool
) -> None:
    placed = pod("koord", cpu="4", node_name="n1", annotations={RS: json.dumps({"cpuset": "0-1,8-9"})})
    ext = serve([*cluster(["n1"]), placed], trust=Trust.of(SIGNER, names.split(",")))
    wait_for(lambda: placed["metadata"]["uid"] in ext.state.pods)
    assert (placed["metadata"]["uid"] in ext.state.nodes["n1"].allocs) is counted


# -- 2. a stale cpuset after a replica died mid-bind ----------------------------------------------


def test_a_stale_cpuset_for_another_node_never_survives_the_bind(
    api: FakeAPIServer, serve: Callable[..., Extender]
) -> None:
    """Replica A wrote ``0-1,8-9`` for n1 and died before its Binding; replica B binds the pod
    to n2, where an LSR pod already holds ``0-1,8-9`` (on main the stale cpuset stayed)."""
    holder = pod("holder", cpu="4", node_name="n2", annotations={RS: json.dumps({"cpuset": "0-1,8-9"})})
    stale = pod("ls", cpu="1500m", qos="LS", annotations={RS: json.dumps({"cpuset": "0-1,8-9"})})
    ext = serve([*cluster(["n1", "n2"]), holder, stale])
    wait_for(lambda: ext.state.pending(stale["metadata"]["uid"]) is not None)
    assert bind(ext, stale, "n2") == ""
    assert RS not in annotations(api, "ls")


def test_a_stale_annotation_written_between_clear_and_binding_fails_the_binding_and_is_cleared_again(
    api: FakeAPIServer
) -> None:
    """The Binding carries the resourceVersion of the clearing patch: a write in between (a
    dying replica's late PATCH) makes it 409, and the bind clears and binds again."""
    for obj in cluster(["n1"]):
        api.create(obj)
    p = api.create(pod("ls", cpu="1", qos="LS", annotations={RS: json.dumps({"cpuset": "0-3"})}))

    class LatePatch:
        def __init__(self) -> None:
            self.inner = bind_client(api.url)
            self.late = True

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        async def bind_pod(self, *args: Any) -> None:
            if self.late:
                self.late = False
                api.patch_direct("pods", "ls", {"metadata": {"annotations": {RS: json.dumps({"cpuset": "4-7"})}}},
                                 "default")
            await self.inner.bind_pod(*args)

    state = ClusterState(TRUST)
    assert load_objects(state, [*cluster(["n1"]), p]) == []
    binder = Binder(state, LatePatch(), ExtenderConfig())

    async def go() -> str:
        try:
            return await binder.bind("default", "ls", p["metadata"]["uid"], "n1")
        finally:
            await binder.aclose()

    assert asyncio.run(go()) == ""
    got = api.get("pods", "ls", "default")
    assert got is not None and got["spec"]["nodeName"] == "n1" and RS not in got["metadata"]["annotations"]


# -- 3. watch liveness, readiness and the ledger's TTL --------------------------------------------


def test_a_silent_watch_is_dropped_and_the_kind_listed_again(
    api: FakeAPIServer, serve: Callable[..., Extender]
) -> None:
    ext = serve(cluster(["n1"]), watch_timeout=30, idle_timeout=0.5)
    listed = api.watch_streams()
    api.freeze_watches("pods")  # a half-open stream: no event, no end (on main it hung for good)
    late = pod("late", cpu="1", qos="LS")
    api.create(late)
    # the watcher lists the pods again (the late pod arrives) before it opens the new stream
    wait_for(lambda: late["metadata"]["uid"] in ext.state.pods and api.watch_streams() > listed)
    assert api.watch_streams() > listed


def test_a_stale_cache_fails_readiness_and_refuses_binds(api: FakeAPIServer, serve: Callable[..., Extender]) -> None:
    """The other kinds' streams end every second (timeoutSeconds) and keep their caches live; the
    frozen pods stream says nothing, and the idle timeout is long: pods go stale."""
    p = pod("web", cpu="2")
    ext = serve([*cluster(["n1"]), p], watch_timeout=1, idle_timeout=60, stale_after=3)
    wait_for(lambda: ext.state.pending(p["metadata"]["uid"]) is not None)
    ready = httpx.get(f"{ext.url}/readyz", timeout=5)
    assert ready.status_code == 200
    api.freeze_watches("pods")
    wait_for(lambda: httpx.get(f"{ext.url}/readyz", timeout=5).status_code == 503)
    text = httpx.get(f"{ext.url}/readyz", timeout=5).text
    assert "pods: stale" in text and "nodes" not in text
    assert "cache of pods is stale" in bind(ext, p, "n1")
    assert 'scheduler_ext_cache_stale{kind="pods"} 1.0' in httpx.get(f"{ext.url}/metrics", timeout=5).text


def test_a_missing_optional_crd_is_reported_not_unready(api: FakeAPIServer) -> None:
    del api.store.resources[("scheduling.koordinator.sh", "devices")]
    ext = start_extender(api.url, stale_after=30)
    try:
        ready = httpx.get(f"{ext.url}/readyz", timeout=5)
        assert ready.status_code == 200 and "devices: not installed" in ready.text
    finally:
        ext.stop()


def test_an_expired_ledger_entry_stays_until_the_replica_s_watch_settled_it(api: FakeAPIServer) -> None:
    """Replica B's watch is stalled (its cache never hears of A's pod). Past the TTL B must still
    see A's ledger entry, or it hands out the same CPUs (on main it did)."""
    objects = cluster(["n1"], format_cpu_topology(TOPO_QUAD_NUMA))
    for obj in objects:
        api.create(obj)
    first, second = api.create(pod("first", cpu="4")), api.create(pod("second", cpu="4"))
    now = [1000.0]

    def replica(name: str) -> tuple[ClusterState, Binder]:
        state = ClusterState(TRUST)
        assert load_objects(state, [*objects, first, second]) == []
        client = bind_client(api.url)
        ledger = LeaseLedger(client, "kube-system", identity=name, ttl=120, settled=state.settled,
                             clock=lambda: now[0])
        return state, Binder(state, client, ExtenderConfig(), ledger)

    _, a = replica("a")
    b_state, b = replica("b")

    async def go() -> None:
        try:
            assert await a.bind("default", "first", first["metadata"]["uid"], "n1") == ""
            now[0] += 600  # long past the TTL; B's pods watch never said a word
            assert await b.bind("default", "second", second["metadata"]["uid"], "n1") == ""
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(go())
    mine = cpus(json.loads(annotations(api, "first")[RS])["cpuset"])
    theirs = cpus(json.loads(annotations(api, "second")[RS])["cpuset"])
    assert not mine & theirs
    # once B's watch shows the pod bound, the expired entry may go: its annotations count now
    got = api.get("pods", "first", "default")
    assert got is not None and b_state.apply("pods", "MODIFIED", got)
    assert b_state.settled(first["metadata"]["uid"], "n1", 1000.0 + 120)
