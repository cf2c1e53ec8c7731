"""Malformed and oversized verb bodies: each gets the verb's own error reply, never a 500.

filter and bind answer HTTP 200 with ``Error`` set (their reply types carry it); prioritize and
preempt answer 400 with the reason (their reply types have no error field). A well-formed body
whose Pod content is invalid is not malformed: the pod is refused on every node instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from scheduler_ext.extender import ExtenderConfig, filter_nodes, preempt_nodes, prioritize_nodes
from scheduler_ext.guard import decode_pod
from scheduler_ext.server import MAX_BODY_BYTES, MAX_NODES, MAX_VICTIM_PODS
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import cluster, pod
from tests.scheduler_ext.conftest import Extender, start_extender

SPEC = "scheduling.koordinator.sh/resource-spec"


@pytest.fixture(scope="module")
def ext() -> Iterator[Extender]:
    api = FakeAPIServer().start()
    for obj in cluster(["n1"]):
        api.create(obj)
    extender = start_extender(api.url)
    try:
        yield extender
    finally:
        extender.stop()
        api.stop()


def j(doc: Any) -> bytes:
    return json.dumps(doc).encode()


GOOD_POD = pod("p", cpu="2")


def pod_with(**changes: Any) -> dict[str, Any]:
    p = json.loads(json.dumps(GOOD_POD))
    for path, value in changes.items():
        target = p
        keys = path.split("__")
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        target[keys[-1]] = value
    return p


def bind_body(**changes: Any) -> bytes:
    body: dict[str, Any] = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"}
    body.update(changes)
    return j(body)


GARBAGE = [
    ("empty", b""),
    ("not JSON", b"{not json"),
    ("JSON null", b"null"),
    ("a JSON array", b"[]"),
    ("a number", b"5"),
    ("a string", b'"filter"'),
    ("arrays nested 5000 deep", b"[" * 5000),
    ("objects nested 2000 deep", b'{"a":' * 2000 + b"1" + b"}" * 2000),
    ("bytes that are not UTF-8", b"\xff\xfe\xfd"),
    ("a number that overflows a double", b'{"Pod": 1e400}'),
    ("a truncated document", b'{"Pod": {"metadata": {"name": "p"'),
]

REFUSED: list[Any] = []
for verb in ("filter", "prioritize", "bind", "preempt"):
    for what, body in GARBAGE:
        REFUSED.append(pytest.param(verb, body, id=f"{verb}: {what} is refused"))

for verb in ("filter", "prioritize"):
    for what, doc in [
        ("a missing Pod", {"NodeNames": ["n1"]}),
        ("a Pod that is a number", {"Pod": 5, "NodeNames": ["n1"]}),
        ("a Pod that is a list", {"Pod": [], "NodeNames": ["n1"]}),
        ("NodeNames that is a string", {"Pod": GOOD_POD, "NodeNames": "n1"}),
        ("NodeNames with numbers", {"Pod": GOOD_POD, "NodeNames": [1, 2]}),
        ("NodeNames with null", {"Pod": GOOD_POD, "NodeNames": [None]}),
        ("NodeNames with one number after strings", {"Pod": GOOD_POD, "NodeNames": ["n1", "n2", 3]}),
        ("NodeNames with a list, a boolean and an object", {"Pod": GOOD_POD, "NodeNames": [["n1"], True, {"n": 1}]}),
        ("more NodeNames than the limit", {"Pod": GOOD_POD, "NodeNames": [f"n{i}" for i in range(MAX_NODES + 1)]}),
        ("Nodes that is a string", {"Pod": GOOD_POD, "Nodes": "n1"}),
        ("Nodes.items that is a number", {"Pod": GOOD_POD, "Nodes": {"items": 5}}),
        ("a Nodes item that is a number", {"Pod": GOOD_POD, "Nodes": {"items": [5]}}),
        ("a Nodes item that is null", {"Pod": GOOD_POD, "Nodes": {"items": [None]}}),
        ("a Nodes item whose metadata is a number", {"Pod": GOOD_POD, "Nodes": {"items": [{"metadata": 5}]}}),
        ("a Nodes item whose name is a number", {"Pod": GOOD_POD, "Nodes": {"items": [{"metadata": {"name": 5}}]}}),
    ]:
        REFUSED.append(pytest.param(verb, j(doc), id=f"{verb}: {what} is refused"))

for what, body in [
    ("a PodName that is a number", bind_body(PodName=5)),
    ("no PodNamespace", bind_body(PodNamespace=None)),
    ("no Node", bind_body(Node=None)),
    ("a Node that is a list", bind_body(Node=["n1"])),
    ("a PodUID that is a number", bind_body(PodUID=5)),
    ("a PodName longer than a DNS name", bind_body(PodName="p" * 300)),
]:
    REFUSED.append(pytest.param("bind", body, id=f"bind: {what} is refused"))

for what, doc in [
    ("NodeNameToMetaVictims that is a number", {"NodeNameToMetaVictims": 5}),
    ("victims that are a number", {"NodeNameToMetaVictims": {"n1": 3}}),
    ("Pods that is a number", {"NodeNameToMetaVictims": {"n1": {"Pods": 5}}}),
    ("a victim that is a number", {"NodeNameToMetaVictims": {"n1": {"Pods": [5]}}}),
    ("a victim UID that is a number", {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": 5}]}}}),
    ("NumPDBViolations that is a string", {"NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": "x"}}}),
    ("NumPDBViolations that is huge", {"NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": 10**30}}}),
    ("NumPDBViolations that is a fraction", {"NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": 1.5}}}),
    ("a full victim whose metadata is a number", {"NodeNameToVictims": {"n1": {"Pods": [{"metadata": 5}]}}}),
    ("a full victim whose uid is a number", {"NodeNameToVictims": {"n1": {"Pods": [{"metadata": {"uid": 7}}]}}}),
    ("more victims than the limit",
     {"NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": f"u{i}"} for i in range(MAX_VICTIM_PODS + 1)]}}}),
]:
    REFUSED.append(pytest.param("preempt", j({"Pod": GOOD_POD, **doc}), id=f"preempt: {what} is refused"))


def post(ext: Extender, verb: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{ext.url}/{verb}", content=body, headers={"Content-Type": "application/json"}, timeout=30)


def assert_refused(verb: str, r: httpx.Response) -> str:
    if verb in ("filter", "bind"):
        assert r.status_code == 200
        reply = r.json()
        assert reply["Error"]
        if verb == "filter":
            assert reply["NodeNames"] is None and reply["Nodes"] is None
        return str(reply["Error"])
    assert r.status_code == 400 and r.text
    return r.text


@pytest.mark.parametrize(("verb", "body"), REFUSED)
def test_malformed_bodies_get_the_verbs_error_reply(ext: Extender, verb: str, body: bytes) -> None:
    assert_refused(verb, post(ext, verb, body))


INVALID_PODS = [
    pytest.param(pod_with(spec__containers__0__resources__requests__memory="1e500000"),
                 id="memory of 1e500000 bytes"),
    pytest.param(pod_with(spec__containers__0__resources__requests__cpu="1e9999999"), id="cpu of 1e9999999 cores"),
    pytest.param(pod_with(spec__containers__0__resources__requests__cpu=[1]), id="a cpu request that is a list"),
    pytest.param(pod_with(spec__containers=5), id="containers that is a number"),
    pytest.param(pod_with(spec__containers=[5]), id="a container that is a number"),
    pytest.param(pod_with(metadata__annotations={SPEC: "[" * 3000}), id="a resource-spec nested 3000 deep"),
    pytest.param(pod_with(metadata__annotations={SPEC: '{"preferredCPUBindPolicy": 5}'}),
                 id="a bind policy that is a number"),
    pytest.param(pod_with(metadata__labels=["LSR"]), id="labels that are a list"),
    pytest.param(pod_with(metadata=5), id="metadata that is a number"),
    pytest.param(pod_with(spec="x"), id="a spec that is a string"),
]


@pytest.mark.parametrize("bad_pod", INVALID_PODS)
def test_a_well_formed_body_with_an_invalid_pod_refuses_the_pod_on_every_node(
    ext: Extender, bad_pod: dict[str, Any]
) -> None:
    r = post(ext, "filter", j({"Pod": bad_pod, "NodeNames": ["n1", "ghost"]}))
    assert r.status_code == 200
    reply = r.json()
    assert reply["Error"] == "" and reply["NodeNames"] == []
    assert set(reply["FailedAndUnresolvableNodes"]) == {"n1", "ghost"}
    assert all("invalid pod request" in why for why in reply["FailedAndUnresolvableNodes"].values())
    scores = post(ext, "prioritize", j({"Pod": bad_pod, "NodeNames": ["n1"]}))
    assert scores.status_code == 200 and all(s["Score"] == 0 for s in scores.json())
    preempt = post(ext, "preempt", j({"Pod": bad_pod, "NodeNameToMetaVictims": {"n1": {"Pods": []}}}))
    assert preempt.status_code == 200 and preempt.json() == {"NodeNameToMetaVictims": {}}


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind", "preempt"])
def test_a_body_over_the_size_limit_is_refused_before_it_is_read(ext: Extender, verb: str) -> None:
    body = b'{"Pod": {}, "NodeNames": ["' + b"n" * MAX_BODY_BYTES + b'"]}'
    error = assert_refused(verb, post(ext, verb, body))
    assert "larger than" in error


def test_a_chunked_body_without_a_length_is_bounded_too(ext: Extender) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"Pod": {}, "NodeNames": ["'
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"n" * 65536
        yield b'"]}'

    try:
        r = httpx.post(f"{ext.url}/filter", content=chunks(), timeout=30)
    except httpx.TransportError:
        return  # the server answered and closed while the upload was still running: refused
    assert "larger than" in assert_refused("filter", r)


def test_the_extender_serves_normally_after_the_corpus(ext: Extender) -> None:
    r = post(ext, "filter", j({"Pod": GOOD_POD, "NodeNames": ["n1"]}))
    assert r.json()["NodeNames"] == ["n1"]
    assert httpx.get(f"{ext.url}/healthz").text == "ok"


@pytest.mark.parametrize(
    "candidate",
    [pytest.param(GOOD_POD, id="a cpuset pod"), pytest.param(pod("plain", cpu="500m", qos="LS"), id="a plain pod")],
)
def test_many_candidates_are_judged_in_slices_with_the_answer_of_one_pass(
    ext: Extender, candidate: dict[str, Any]
) -> None:
    names = [f"ghost{i}" for i in range(1200)]
    names.insert(700, "n1")
    req = decode_pod(candidate)
    whole = filter_nodes(ext.state, req, names, ExtenderConfig())
    reply = post(ext, "filter", j({"Pod": candidate, "NodeNames": names})).json()
    assert reply["Error"] == ""
    assert (reply["NodeNames"], reply["FailedNodes"], reply["FailedAndUnresolvableNodes"]) == (
        whole.passed, whole.failed, whole.unresolvable)
    scores = post(ext, "prioritize", j({"Pod": candidate, "NodeNames": names})).json()
    assert [(s["Host"], s["Score"]) for s in scores] == prioritize_nodes(ext.state, req, names, ExtenderConfig())
    victims = {n: ["u"] for n in names}
    kept = post(ext, "preempt", j({"Pod": candidate, "NodeNameToMetaVictims": {
        n: {"Pods": [{"UID": "u"}]} for n in names}})).json()["NodeNameToMetaVictims"]
    assert {n: [p["UID"] for p in v["Pods"]] for n, v in kept.items()} == preempt_nodes(
        ext.state, req, victims, ExtenderConfig())
