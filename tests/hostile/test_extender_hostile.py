"""Adversarial tests of the scheduler extender, one per class of attack.

- Poisoned watch objects (pods, Nodes, NRTs, Devices with malformed annotations or wrong
  types), followed by correct allocation for later pods, in a running extender and in a fresh
  replica that lists them at start.
- Anonymous and badly certified verb calls, refused in the TLS handshake; a reachable
  listener without mutual TLS refused at start.
- Hostile Reservations (wrong types, huge lists and maps, deep or bombed annotations, CPUs
  outside the node) and hostile ``reservation-affinity`` / ``reservation-allocated`` pod
  annotations: refused by their one parser, costing only their own object or pod.
- Forged allocations: hostile signature annotations (garbage, over its bound, another version, a
  signature of other values, another pod's, an unknown key's claiming more than its pod's
  request) verify nothing and cost only their pod; a hostile ``--signing-key-file`` (FIFO,
  directory, device, 5 GB sparse file, not a PEM Ed25519 key) is refused at start with one
  line, at once.
- ``scheduler-ext simulate`` on hostile documents: no traceback, a documented exit code, the
  result alone on stdout and every log line on stderr.
- A 500-byte filter body whose memory request is ``1e500000``: answered at once, while a
  concurrent ``/healthz`` probe keeps being served (its worst latency is a generous safety
  bound on the loop's stall, not a speed claim; speed is measured in ``benchmarks/``).

Everything runs against the fake API server (``tests/fakeapi.py``) through the official
``kubernetes`` client, as ``scheduler-ext serve`` does, on loopback only.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from koord_formats.errors import FormatError
from koord_formats.reservation import parse_reservation, parse_reservation_affinity, parse_reservation_allocated
from koord_formats.signature import MAX_SIGNATURE_CHARS
from scheduler_ext.extender import ExtenderConfig, evaluate, plan
from scheduler_ext.pods import parse_pod
from scheduler_ext.state import ClusterState, load_objects
from scheduler_ext.trust import SIGNATURE_ANNOTATION, Signer, Trust
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import cluster, cpus, device, node, nrt, pod, reservation
from tests.scheduler_ext.conftest import TRUST, Extender, start_extender

RS = "scheduling.koordinator.sh/resource-status"
DA = "scheduling.koordinator.sh/device-allocated"
SPEC = "scheduling.koordinator.sh/resource-spec"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer().start()
    try:
        yield server
    finally:
        server.stop()


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.02)


def poisoned_objects() -> list[dict[str, Any]]:
    """Bound and pending pods, a Node, an NRT and a Device, each malformed in its own way."""
    def bound(name: str, annotations: dict[str, Any]) -> dict[str, Any]:
        return pod(name, cpu="4", node_name="n1", annotations=annotations)

    wrong_labels = node("n2")
    wrong_labels["metadata"]["labels"] = ["not", "a", "map"]
    wrong_spec = pod("wrong-spec", node_name="n1")
    wrong_spec["spec"] = ["x"]
    wrong_ann = pod("wrong-annotation-type", node_name="n1")
    wrong_ann["metadata"]["annotations"] = {RS: {"cpuset": "0-15"}}
    return [
        bound("gpu-number", {DA: '{"gpu":[5]}'}),
        bound("gpu-minor-overflow", {DA: '{"gpu":[{"minor":1e400}]}'}),
        bound("cpuset-number", {RS: '{"cpuset":5}'}),
        bound("status-deep", {RS: "[" * 3000}),
        bound("spec-deep", {SPEC: "[[[" * 1000}),
        pod("pending-spec-deep", annotations={SPEC: "[" * 3000}),
        pod("pending-huge-memory", memory="1e500000"),
        wrong_spec,
        wrong_ann,
        wrong_labels,
        nrt("n3", "[" * 3000),
        {**device("n1", 2), "spec": {"devices": [{"type": "gpu", "minor": 0, "resources": [1]}]}},
    ]


def bind(ext: Extender, p: dict[str, Any], node_name: str = "n1") -> str:
    body = {"PodName": p["metadata"]["name"], "PodNamespace": p["metadata"]["namespace"],
            "PodUID": p["metadata"]["uid"], "Node": node_name}
    return str(httpx.post(f"{ext.url}/bind", json=body, timeout=30).json()["Error"])


def cpuset_of(api: FakeAPIServer, name: str) -> frozenset[int]:
    got = api.get("pods", name, "default")
    assert got is not None and got["spec"].get("nodeName") == "n1"
    return cpus(json.loads(got["metadata"]["annotations"][RS])["cpuset"])


def bad_objects_counted(ext: Extender) -> float:
    text = httpx.get(f"{ext.url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r'^scheduler_ext_bad_objects_total\{[^}]*\} (\S+)$', text, re.M))


def bind_three_and_check(api: FakeAPIServer, ext: Extender, keeper: frozenset[int]) -> None:
    """Three 4-CPU pods fill the 12 CPUs the keeper left on the 16-CPU node, all disjoint."""
    later = [pod(f"later{i}", cpu="4") for i in range(3)]
    for p in later:
        api.create(p)
    wait_for(lambda: all(ext.state.pending(p["metadata"]["uid"]) for p in later))
    assert [bind(ext, p) for p in later] == ["", "", ""]
    sets = [cpuset_of(api, p["metadata"]["name"]) for p in later]
    assert all(len(s) == 4 for s in sets)
    assert not any(s & keeper for s in sets)
    assert len(frozenset().union(*sets)) == 12
    assert bind(ext, api.create(pod("one-too-many", cpu="2"))) != ""  # the node is full


def test_poisoned_watch_objects_cost_only_themselves_in_a_running_extender(api: FakeAPIServer) -> None:
    for obj in cluster(["n1"]):
        api.create(obj)
    ext = start_extender(api.url)
    try:
        for obj in poisoned_objects():
            api.create(obj)
        keeper = api.create(pod("keeper", cpu="4", node_name="n1", annotations={RS: '{"cpuset":"0-1,8-9"}'}))
        leaver = api.create(pod("leaver", cpu="4", node_name="n1", annotations={RS: '{"cpuset":"2-3,10-11"}'}))
        wait_for(lambda: leaver["metadata"]["uid"] in ext.state.pods)
        api.delete("pods", "leaver", "default")  # a deletion after the poison is still seen
        wait_for(lambda: keeper["metadata"]["uid"] in ext.state.pods
                 and leaver["metadata"]["uid"] not in ext.state.pods)
        assert httpx.get(f"{ext.url}/readyz").status_code == 200
        assert bad_objects_counted(ext) >= 8
        bind_three_and_check(api, ext, cpus("0-1,8-9"))
    finally:
        ext.stop()


def test_a_fresh_replica_lists_poisoned_objects_and_becomes_ready(api: FakeAPIServer) -> None:
    for obj in [*cluster(["n1"]), *poisoned_objects()]:
        api.create(obj)
    api.create(pod("keeper", cpu="4", node_name="n1", annotations={RS: '{"cpuset":"4-5,12-13"}'}))
    ext = start_extender(api.url)  # waits for readiness
    try:
        bind_three_and_check(api, ext, cpus("4-5,12-13"))
    finally:
        ext.stop()


# -- bounded work on the loop -----------------------------------------------------------------


class HealthProbe:
    """GET /healthz back to back from a thread; ``worst`` is the slowest answer in seconds."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self.calls = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                assert client.get(f"{self.url}/healthz").text == "ok"
                self.worst = max(self.worst, time.perf_counter() - started)
                self.calls += 1
                time.sleep(0.005)

    def __enter__(self) -> HealthProbe:
        self.thread.start()
        wait_for(lambda: self.calls > 0, 60)  # probing before the work starts (a loaded host is slow)
        return self

    def __exit__(self, *exc: object) -> None:
        seen = self.calls
        wait_for(lambda: self.calls > seen + 1, 60)  # and answered after it ended
        self.stop.set()
        self.thread.join(60)


def test_a_filter_with_an_exponent_bomb_is_answered_at_once_and_the_loop_keeps_serving(
    api: FakeAPIServer
) -> None:
    for obj in cluster(["n1", "n2"]):
        api.create(obj)
    ext = start_extender(api.url)
    try:
        bomb = {"metadata": {"name": "bomb", "namespace": "default", "uid": "u1",
                             "labels": {"koordinator.sh/qosClass": "LSR"}},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1", "memory": "1e500000"}}}]}}
        body = json.dumps({"Pod": bomb, "NodeNames": ["n1", "n2"]}).encode()
        assert len(body) < 512
        with HealthProbe(ext.url) as probe:
            reply = httpx.post(f"{ext.url}/filter", content=body, timeout=60).json()
        assert reply["Error"] == "" and reply["NodeNames"] == []
        assert set(reply["FailedAndUnresolvableNodes"]) == {"n1", "n2"}
        assert "invalid pod request" in reply["FailedAndUnresolvableNodes"]["n1"]
        assert probe.calls > 0
        assert probe.worst < 2.0, f"/healthz waited {probe.worst:.2f} s while the filter ran"
        ok = httpx.post(f"{ext.url}/filter", json={"Pod": pod("fine", cpu="2"), "NodeNames": ["n1"]}).json()
        assert ok["NodeNames"] == ["n1"]
    finally:
        ext.stop()


# -- authentication --------------------------------------------------------------------------


def test_anonymous_and_badly_certified_verbs_are_refused(
    api: FakeAPIServer, tmp_path: Any
) -> None:
    from tests.scheduler_ext.test_sched_tls import spawn_tls, stop
    from tests.scheduler_ext.tlscerts import client_context, make_pki

    pki = make_pki(tmp_path)
    p = pod("web", cpu="2")
    for obj in [*cluster(["n1"]), p]:
        api.create(obj)
    ext = spawn_tls(api.url, pki)
    body = {"PodName": "web", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "n1"}
    try:
        for cert, key in ((None, None), (pki.other_cert, pki.other_key)):
            with httpx.Client(verify=client_context(pki, cert, key), timeout=10) as client, \
                    pytest.raises(httpx.TransportError):
                client.post(f"{ext.url}/bind", json=body)
        with pytest.raises(httpx.TransportError):
            httpx.post(ext.url.replace("https:", "http:") + "/bind", json=body, timeout=10)
        got = api.get("pods", "web", "default")
        assert got is not None and "nodeName" not in got["spec"]  # nobody moved the pod
        with httpx.Client(verify=client_context(pki, pki.client_cert, pki.client_key), timeout=10) as client:
            reply = client.post(f"{ext.url}/filter", json={"Pod": p, "NodeNames": ["n1"]})
        assert reply.json()["NodeNames"] == ["n1"]  # the trusted caller is served
    finally:
        stop(ext)


# The child replaces uvicorn's entry points by recorders before running the CLI, so even code
# that would serve never binds a socket beyond loopback.
_RECORDING_UVICORN = """
import sys
import uvicorn

def record_run(*args, **kwargs):
    print("served", flush=True)

async def record_serve(self, *args, **kwargs):
    print("served", flush=True)

uvicorn.run = record_run
uvicorn.Server.serve = record_serve
from scheduler_ext import cli
raise SystemExit(cli.main(sys.argv[1:]))
"""


def test_a_reachable_listener_without_mutual_tls_is_refused_at_start() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _RECORDING_UVICORN, "serve", "--api-server", "http://127.0.0.1:9",
         "--listen", "0.0.0.0:8888", "--no-ha-ledger"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert "served" not in done.stdout
    assert done.returncode == 2
    assert "--tls-client-ca" in done.stderr and "Traceback" not in done.stderr


# -- forged allocations ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "seal",
    [
        pytest.param("", id="empty"),
        pytest.param("v1.", id="the version alone"),
        pytest.param("v1." + "A" * (MAX_SIGNATURE_CHARS * 100), id="over its bound"),
        pytest.param("v2.c2VhbA", id="another version"),
        pytest.param("v1.\u0000\uffff" * 8, id="control and odd characters"),
        pytest.param(TRUST.sign("uid-p", "default", "p", "a", 16000, {RS: json.dumps({"cpuset": "0-1"})}),
                     id="a signature of other values"),
        pytest.param(TRUST.sign("uid-other", "default", "p", "a", 16000, {RS: json.dumps({"cpuset": "0-15"})}),
                     id="another pod's signature"),
        pytest.param(TRUST.sign("uid-p", "default", "other", "a", 16000, {RS: json.dumps({"cpuset": "0-15"})}),
                     id="signed for another name"),
        pytest.param(Trust.of(Signer.generate(), []).sign("uid-p", "default", "p", "a", 16000,
                                                          {RS: json.dumps({"cpuset": "0-15"})}),
                     id="an unknown key's, over the pod's request"),
    ],
)
def test_a_hostile_signature_verifies_nothing_and_costs_only_its_pod(seal: str | None) -> None:
    assert seal is not None
    state = ClusterState(TRUST)
    forged = pod("p", cpu="1", qos="LS", node_name="a", scheduler_name="default-scheduler", uid="uid-p",
                 annotations={RS: json.dumps({"cpuset": "0-15"}), SIGNATURE_ANNOTATION: seal})
    assert load_objects(state, [*cluster(["a"]), forged]) == []
    assert state.nodes["a"].allocs == {}
    ns = state.nodes["a"]
    assert plan(ns, parse_pod(pod("next", cpu="16")), ExtenderConfig()).allocation.cpus == cpus("0-15")


def _key_case(kind: str, tmp: Path) -> str:
    import os

    path = tmp / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        return "/dev/zero"
    elif kind == "sparse":
        with open(path, "wb") as fh:
            fh.truncate(5 << 30)
    elif kind == "short":
        path.write_bytes(b"tooshort\n")
    elif kind == "symlink-to-fifo":
        os.mkfifo(tmp / "target")
        path.symlink_to(tmp / "target")
    return str(path)


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "sparse", "short", "symlink-to-fifo", "missing"])
def test_a_hostile_signing_key_file_is_refused_at_start(tmp_path: Path, kind: str) -> None:
    path = _key_case(kind, tmp_path)
    done = subprocess.run(  # a read that blocked on the FIFO would run into the timeout
        [sys.executable, "-m", "scheduler_ext.cli", "serve", "--api-server", "http://127.0.0.1:9",
         "--listen", "127.0.0.1:0", "--no-ha-ledger", "--signing-key-file", path],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--signing-key-file" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# -- the simulate CLI ------------------------------------------------------------------------


def _simulate_cases() -> list[Any]:
    base = {"objects": cluster(["a"]), "pod": pod("new", cpu="2")}
    typed = json.loads(json.dumps(base))
    typed["objects"] += [5, None, {"kind": "Node", "metadata": 5}, {"kind": "Device", "metadata": {"name": "a"},
                                                                       "spec": [1]}]
    poisoned = json.loads(json.dumps(base))
    poisoned["objects"] += [pod("p", node_name="a", annotations={DA: '{"gpu":[5]}'}),
                            pod("q", node_name="a", annotations={RS: "[" * 3000})]
    bomb = json.loads(json.dumps(base))
    bomb["pod"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1e500000"
    return [
        pytest.param(json.dumps(typed), 0, id="wrongly typed objects are skipped and named"),
        pytest.param(json.dumps(poisoned), 0, id="poisoned annotations log on stderr, JSON stays on stdout"),
        pytest.param(json.dumps(bomb), 0, id="an exponent bomb in the pod is an infeasible pod"),
        pytest.param("objects: [\n  - {kind: Node", 3, id="a YAML syntax error"),
        pytest.param("[" * 50000, 3, id="JSON nested 50000 deep"),
        pytest.param('{"objects": {}, "pod": 1}', 3, id="a document of the wrong shape"),
        pytest.param(None, 2, id="a missing file"),
    ]


@pytest.mark.parametrize(("text", "code"), _simulate_cases())
def test_simulate_never_prints_a_traceback(tmp_path: Path, text: str | None, code: int) -> None:
    path = tmp_path / "doc.yaml"
    if text is not None:
        path.write_text(text)
    done = subprocess.run([sys.executable, "-m", "scheduler_ext.cli", "simulate", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    assert done.returncode == code, done.stderr
    if code == 0:
        result = json.loads(done.stdout)  # one JSON document and nothing else
        assert set(result) == {"pod", "nodes", "selected", "skipped"}
    else:
        assert done.stdout == ""
        assert done.stderr.startswith("scheduler-ext simulate: ")


# -- Reservations ----------------------------------------------------------------------------------

RA = "scheduling.koordinator.sh/reservation-allocated"
AFFINITY = "scheduling.koordinator.sh/reservation-affinity"


def _resv(**changes: Any) -> dict[str, Any]:
    """A good Reservation on n1 (CPUs 4-5,12-13, owners: pods labelled app=web) with
    ``changes`` applied as dotted paths (``{"spec.owners": 5}``)."""
    doc = reservation("r-good", "n1", cpuset="4-5,12-13")
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        target = doc
        for key in parents:
            target = target.setdefault(key, {})
        target[leaf] = value
    return doc


HOSTILE_RESERVATIONS = [
    pytest.param(_resv(**{"spec.owners": "everyone"}), id="owners that are a string"),
    pytest.param(_resv(**{"spec.owners": [{}] * 100_000}), id="a hundred thousand owners"),
    pytest.param(_resv(**{"spec.owners": [{"labelSelector": {"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["x"] * 100_000}]}}]}), id="a selector with 100000 values"),
    pytest.param(_resv(**{"spec.owners": [{"labelSelector": {"matchExpressions": [
        {"key": "app", "operator": "Near", "values": ["x"]}]}}]}), id="a selector with an unknown operator"),
    pytest.param(_resv(**{"spec.owners": [{"controller": {"controller": "yes"}}]}),
                 id="a controller flag that is a string"),
    pytest.param(_resv(**{"spec.allocateOnce": "yes"}), id="allocateOnce that is a string"),
    pytest.param(_resv(**{"spec.allocatePolicy": "Greedy"}), id="an unknown allocatePolicy"),
    pytest.param(_resv(**{"spec.taints": [{"key": "k"}] * 100_000}), id="a hundred thousand taints"),
    pytest.param(_resv(**{"status.phase": 7}), id="a phase that is a number"),
    pytest.param(_resv(**{"status.nodeName": ["n1"]}), id="a nodeName that is a list"),
    pytest.param(_resv(**{"status.allocatable": {"cpu": "1e500000"}}), id="an allocatable exponent bomb"),
    pytest.param(_resv(**{"metadata.labels": {f"k{i}": "v" for i in range(5000)}}), id="five thousand labels"),
    pytest.param(_resv(**{"metadata.labels": {"k": "v" * 100_000}}), id="a label value of 100000 characters"),
    pytest.param(_resv(**{"metadata.annotations": {RS: "[" * 3000}}), id="a resource-status nested 3000 deep"),
    pytest.param(_resv(**{"metadata.annotations": {RS: '{"cpuset":"0-99999999"}'}}),
                 id="a resource-status naming a hundred million CPUs"),
    pytest.param(_resv(**{"metadata.annotations": {RS: 5}}), id="a resource-status that is a number"),
    pytest.param(_resv(**{"spec.template": {"metadata": {"annotations": {SPEC: "{" * 3000}}}}),
                 id="a template resource-spec nested 3000 deep"),
]


@pytest.mark.parametrize("doc", HOSTILE_RESERVATIONS)
def test_a_hostile_reservation_is_refused_by_its_parser_at_once(doc: dict[str, Any]) -> None:
    started = time.perf_counter()
    with pytest.raises(FormatError):
        parse_reservation(doc)
    assert time.perf_counter() - started < 5  # a generous bound: the parser stops at the first bound


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[" * 3000, id="nested 3000 deep"),
        pytest.param('{"name":"' + "r" * 300_000 + '"}', id="larger than any annotation"),
        pytest.param(json.dumps({"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
            {"matchExpressions": [{"key": "k", "operator": "Exists"}]}] * 10_000}}), id="ten thousand terms"),
        pytest.param(json.dumps({"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
            {"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["9" * 5000]}]}]}}),
            id="a Gt value of 5000 digits"),
        pytest.param(json.dumps({"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
            {"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}]}}),
            id="a field other than metadata.name"),
        pytest.param(json.dumps({"tolerations": [{"operator": "Maybe"}]}), id="a toleration with an unknown operator"),
        pytest.param(json.dumps({"reservationSelector": ["a"]}), id="a selector that is a list"),
        pytest.param('"reservation"', id="a string instead of an object"),
    ],
)
def test_a_hostile_reservation_affinity_refuses_only_its_pod(text: str) -> None:
    with pytest.raises(FormatError):
        parse_reservation_affinity(text)
    req = parse_pod(pod("p", annotations={AFFINITY: text}))
    assert req.error.startswith("invalid pod request: ")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[" * 3000, id="nested 3000 deep"),
        pytest.param('{"name":{"a":1}}', id="a name that is an object"),
        pytest.param('{"uid":"' + "u" * 5000 + '"}', id="a uid of 5000 characters"),
        pytest.param("not json", id="not JSON"),
    ],
)
def test_a_hostile_reservation_allocated_costs_only_the_link(text: str) -> None:
    with pytest.raises(FormatError):
        parse_reservation_allocated(text)
    state = ClusterState()
    load_objects(state, [*cluster(["n1"]), pod("member", cpu="4", node_name="n1",
                                               annotations={RS: '{"cpuset":"0-1,8-9"}', RA: text})])
    ns = state.nodes["n1"]
    ns.refresh()
    assert not ns.free & cpus("0-1,8-9")  # the pod's CPUs still count


def test_a_reservation_naming_cpus_outside_the_node_gives_only_the_node_s_own() -> None:
    state = ClusterState()
    skipped = load_objects(state, [*cluster(["n1"]), reservation("r", "n1", cpuset="6-7,14-15,200-400")])
    assert skipped == []
    ns = state.nodes["n1"]
    p = pod("web", cpu="4", resource_spec={"requiredCPUBindPolicy": "FullPCPUs"})
    p["metadata"]["labels"]["app"] = "web"
    with state.lock:
        placement = plan(ns, parse_pod(p), ExtenderConfig())
    assert placement.allocation.cpus == cpus("6-7,14-15")  # the reserved CPUs the node has


def test_hostile_reservations_cost_only_themselves_in_a_running_extender(api: FakeAPIServer) -> None:
    for obj in cluster(["n1"]):
        api.create(obj)
    ext = start_extender(api.url)
    try:
        before = bad_objects_counted(ext)
        for i, param in enumerate(HOSTILE_RESERVATIONS[:6]):
            doc = json.loads(json.dumps(param.values[0]))
            doc["metadata"]["name"] = f"bad-{i}"
            doc["metadata"]["uid"] = f"bad-uid-{i}"
            api.create(doc)
        good = api.create(reservation("r-good", "n1", cpuset="4-5,12-13"))
        wait_for(lambda: good["metadata"]["uid"] in ext.state.reservations)
        assert bad_objects_counted(ext) >= before + 6
        assert httpx.get(f"{ext.url}/readyz").status_code == 200
        web = pod("web", cpu="4", resource_spec={"requiredCPUBindPolicy": "FullPCPUs"})
        web["metadata"]["labels"]["app"] = "web"
        api.create(web)
        wait_for(lambda: ext.state.pending(web["metadata"]["uid"]) is not None)
        assert bind(ext, web) == ""
        assert cpuset_of(api, "web") == cpus("4-5,12-13")
        got = api.get("pods", "web", "default")
        assert got is not None and json.loads(got["metadata"]["annotations"][RA])["name"] == "r-good"
    finally:
        ext.stop()


def test_thousands_of_reservations_on_one_node_cost_work_in_proportion() -> None:
    """5000 reservations on one node, all matching the pod: each is weighed, none twice for the
    same answer (a generous safety bound, not a speed claim; see ``benchmarks/``)."""
    state = ClusterState()
    load_objects(state, [*cluster(["n1"]), *(
        reservation(f"r{i}", "n1", cpuset=str(i % 16), allocate_once=False) for i in range(5000))])
    p = pod("web", cpu="2", resource_spec={"requiredCPUBindPolicy": "FullPCPUs"})
    p["metadata"]["labels"]["app"] = "web"
    started = time.thread_time()
    with state.lock:
        verdict = evaluate(state.nodes["n1"], parse_pod(p), ExtenderConfig())
    assert time.thread_time() - started < 5
    assert not verdict.ok and verdict.reason == "not enough cpus available to satisfy request"
