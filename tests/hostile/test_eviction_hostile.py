"""Hostile input to the evictions costs only its own pod.

- Pods with a hostile ``koordinator.sh/eviction-policy`` or ``extended-resource-spec`` are left
  out (a malformed one with a recorded skip), while a healthy BE pod on the same node is still evicted and no pod
  that is not BE ever is (both plugins, through the plugin manager's hook).
- An API server that answers an Eviction with garbage, a huge body, a hang or a refused
  connection gives that eviction a ``failed`` result; the next pod's eviction goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import Any

import kubernetes
import pytest

from hooks.facts import PodFacts
from hooks.manager import make_plugin_manager
from hooks.plan import Eviction, Plan
from hooks.usage import BEState, ResourceUsage, Usage, UsageSample
from runtime_proxy.loops.evict import ApiEvictor
from tests.hooks.plugins.factories import node

POLICY = "koordinator.sh/eviction-policy"
SPEC = "node.koordinator.sh/extended-resource-spec"
HOSTILE = [
    pytest.param("[" * 100_000, id="a hundred thousand open brackets"),
    pytest.param('["BEMemoryEvict","BECPUEvict"' + ',"x"' * 50_000 + "]", id="fifty thousand names"),
    pytest.param('["' + "B" * 200_000 + '"]', id="a name of 200 KB"),
    pytest.param("[1e999999]", id="a huge exponent"),
    pytest.param('["\\ud800"]', id="a lone surrogate"),
    pytest.param("\x00" * 1000, id="NUL bytes"),
]
SLO = {"resourceUsedThresholdWithBE": {"enable": True, "cpuEvictBESatisfactionLowerPercent": 40,
                                       "cpuEvictBESatisfactionUpperPercent": 80}}


def pod(name: str, qos: str, annotations: dict[str, str]) -> PodFacts:
    spec = json.dumps({"containers": {"c": {"requests": {"kubernetes.io/batch-cpu": "4000"}}}})
    return PodFacts(name=name, namespace="ns", uid=f"uid-{name}",
                    labels=MappingProxyType({"koordinator.sh/qosClass": qos}),
                    annotations=MappingProxyType({SPEC: spec, **annotations}))


@pytest.mark.parametrize("text", HOSTILE)
@pytest.mark.parametrize("key", [POLICY, SPEC])
def test_hostile_annotations_protect_only_their_pod(text: str, key: str) -> None:
    pods = (pod("hostile", "BE", {key: text}), pod("healthy", "BE", {}), pod("ls", "LS", {}))
    users = MappingProxyType({p.uid: ResourceUsage(cpu_milli=3000, memory_bytes=60 << 30) for p in pods})
    usage = Usage(samples=tuple(
        UsageSample(at=float(i), node_memory_used_bytes=95 << 30, node_memory_total_bytes=100 << 30,
                    be_cpu_milli=1000, be=BEState(cpuset=frozenset({0})), pods=users)
        for i in range(30)))
    # memory_evict does not read the extended-resource-spec: only cpu_evict meets that one.
    builtins = ("memory_evict", "cpu_evict") if key == POLICY else ("cpu_evict",)
    pm = make_plugin_manager(builtins=builtins, entry_points=False)
    started = time.perf_counter()
    plans: list[Plan] = [p for p in pm.hook.rhp_reconcile_usage(node=node(slo=SLO), pods=pods, usage=usage) if p]
    assert time.perf_counter() - started < 1.0
    evicted = {e.name for plan in plans for e in plan.evictions}
    assert evicted == {"healthy"}


class _Hostile(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        name = self.path.split("/")[-2]
        if name == "hang":
            time.sleep(3)
        if name == "huge":
            body = b'{"kind":"Status","message":"' + b"x" * (8 << 20) + b'"}'
            code = 500
        elif name == "garbage":
            body, code = b"\x00\xff not json {{{", 201
        elif name == "teapot":
            body, code = b'{"kind":"Status","code":418}', 418
        else:
            body, code = b'{"kind":"Status","status":"Success","code":201}', 201
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(body)


@pytest.fixture
def hostile_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _client(url: str) -> kubernetes.client.ApiClient:
    conf = kubernetes.client.Configuration()
    conf.host = url
    conf.retries = False
    return kubernetes.client.ApiClient(conf)


def test_a_hostile_api_server_costs_only_the_eviction_it_answers(hostile_server: str) -> None:
    evictor = ApiEvictor(_client(hostile_server), request_timeout=1.0)
    names = ["garbage", "huge", "hang", "teapot", "fine"]
    results = asyncio.run(evictor.evict([Eviction(f"u-{n}", "ns", n, "BEMemoryEvict", "r") for n in names]))
    status = {r.eviction.name: r.status for r in results}
    # A reply that does not decode is not trusted: a later round asks again (and gets 404 if the
    # pod did go).
    assert status == {"garbage": "failed", "huge": "failed", "hang": "failed", "teapot": "failed", "fine": "evicted"}
    assert all(len(r.message) <= 300 for r in results)


def test_an_api_server_that_is_not_there_fails_the_eviction() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    evictor = ApiEvictor(_client(f"http://127.0.0.1:{port}"), request_timeout=1.0)
    (result,) = asyncio.run(evictor.evict([Eviction("u", "ns", "p", "BECPUEvict", "r")]))
    assert result.status == "failed"
