"""Liveness tells the truth (issue 32 item 3), for each component that watches the cluster: its
``/healthz`` fails once a watch it needs has heard nothing from the API server past its bound
(so kubelet restarts it), while ``/readyz`` keeps meaning "can serve now"; and a watch survives
a ``BaseException`` raised inside it (what killed every watch thread on the old main).

Against the in-process fake API server (``tests/fakeapi.py``) on 127.0.0.1; the API server
"dies" by answering every request 503 from then on (``_kill``: its storage gone, as kube-apiserver
without etcd), while the streams open at that moment run to their end.
"""

from __future__ import annotations

import asyncio
import http.client
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import structlog

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from rhp_devenv.kube import free_port as _free_port  # noqa: E402

from tests.fakeapi import FakeAPIServer  # noqa: E402
from tests.scheduler_ext.builders import cluster, pod  # noqa: E402
from tests.scheduler_ext.conftest import start_extender  # noqa: E402


def _get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def _until(check: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout:g} s")
        time.sleep(0.05)


def _kill(api: FakeAPIServer) -> None:
    """Every request from now on fails (503), lists and watches alike."""
    api.inject("GET", ".", 503, times=10**9, reason="ServiceUnavailable", message="storage gone")


# ---- the extender ------------------------------------------------------------------------------


def test_the_extenders_healthz_fails_when_its_watches_are_dead_past_the_bound() -> None:
    """Old main: after an outage ``/readyz`` went 503 and stayed there while ``/healthz`` said ok,
    so nothing restarted the extender."""
    api = FakeAPIServer().start()
    ext = None
    try:
        for obj in cluster(["n1"]):
            api.create(obj)
        ext = start_extender(api.url, watch_timeout=1, idle_timeout=2.0, stale_after=3.0, dead_after=6.0)
        port = int(ext.url.rsplit(":", 1)[1])
        assert _get(port, "/healthz")[0] == 200
        assert _get(port, "/readyz")[0] == 200
        _kill(api)
        _until(lambda: _get(port, "/readyz")[0] == 503, what="/readyz 503")
        assert _get(port, "/healthz")[0] == 200  # not ready, but not yet dead
        _until(lambda: _get(port, "/healthz")[0] == 503, what="/healthz 503")
        _, body = _get(port, "/healthz")
        assert "no word from the API server" in body, body
    finally:
        if ext is not None:
            ext.stop()
        api.stop()


def test_the_extenders_watch_survives_a_base_exception_raised_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``structlog.DropEvent`` (a ``BaseException``) raised while an event is applied, as the
    repeat limiter raised it out of a log call inside the client: on the old main the pod watch
    thread died and the cache never saw another pod."""
    from scheduler_ext.state import ClusterState

    raised: list[str] = []
    real_apply = ClusterState.apply

    def apply(self: ClusterState, kind: str, event: str, obj: Any) -> bool:
        if kind == "pods" and len(raised) < 2:
            raised.append(event)
            raise structlog.DropEvent
        return real_apply(self, kind, event, obj)

    monkeypatch.setattr(ClusterState, "apply", apply)
    with FakeAPIServer() as api:
        for obj in cluster(["n1"]):
            api.create(obj)
        ext = start_extender(api.url, watch_timeout=5)
        try:
            created = [api.create(pod(f"p{i}", namespace="ns")) for i in range(3)]
            uids = {c["metadata"]["uid"] for c in created}
            _until(lambda: uids <= set(ext.state.pods), what="the pods in the cache")
            assert raised  # the handler did raise
            port = int(ext.url.rsplit(":", 1)[1])
            assert _get(port, "/healthz")[0] == 200
        finally:
            ext.stop()


# ---- the manager -------------------------------------------------------------------------------


def test_the_managers_healthz_fails_when_its_watches_are_dead_past_the_bound(tmp_path: Path) -> None:
    """Old main: the manager served only ``/metrics`` (200 for any path, also ``/healthz``) and
    kept its Lease with dead watches."""
    port = _free_port()
    api = FakeAPIServer().start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: f, cluster: {{server: '{api.url}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: f, user: u}}]\n")
    log = (tmp_path / "manager.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_ext.entry", "manager", f"--kubeconfig={kubeconfig}",
         "--identity=only", f"--metrics-listen=127.0.0.1:{port}", "--watch-timeout=1",
         "--watch-idle-timeout=2", "--watch-dead-after=6"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        def answers(path: str, status: int) -> Callable[[], bool]:
            def check() -> bool:
                try:
                    return _get(port, path)[0] == status
                except OSError:
                    return False
            return check

        _until(answers("/readyz", 200), what="manager /readyz 200")
        assert _get(port, "/healthz")[0] == 200
        assert "rhp_kube_watch_last_heard_timestamp_seconds" in _get(port, "/metrics")[1]
        _kill(api)
        _until(answers("/healthz", 503), what="manager /healthz 503")
        assert "no word from the API server" in _get(port, "/healthz")[1]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()
        api.stop()


# ---- the node agent ------------------------------------------------------------------------------


async def test_the_node_agents_healthz_fails_when_its_cluster_watch_is_dead_past_the_bound() -> None:
    """The node config's cluster watch (``fromCluster``) behind the probe server every node
    command serves: old main's ``/healthz`` answered 200 whatever the watch did."""
    from runtime_proxy import metrics
    from runtime_proxy.state.nodeconfig import ClusterWatch, NodeConfig

    api = FakeAPIServer().start()
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a"}}})
    conf = kubernetes.client.Configuration()
    conf.host = api.url
    watch = ClusterWatch("n1", api_client=kubernetes.client.ApiClient(conf), watch_timeout=1, read_deadline=2,
                         dead_after=6)
    cfg = NodeConfig(cluster=watch, node_name="n1")
    port = _free_port()
    server = metrics.serve(f"127.0.0.1:{port}", None, cfg.liveness)
    await cfg.start()
    try:
        deadline = time.monotonic() + 60
        while cfg.current().labels.get("zone") != "a":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert (await asyncio.to_thread(_get, port, "/healthz"))[0] == 200
        _kill(api)
        while (await asyncio.to_thread(_get, port, "/healthz"))[0] != 503:
            assert time.monotonic() < deadline + 60, "node /healthz never failed"
            await asyncio.sleep(0.2)
        assert (await asyncio.to_thread(_get, port, "/readyz"))[0] == 200  # readiness is the command's own
    finally:
        await cfg.stop()
        server.shutdown()
        server.server_close()
        api.stop()
