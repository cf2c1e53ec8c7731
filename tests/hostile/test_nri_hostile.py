"""``runtime-proxy nri`` given hostile payloads by its runtime, per Plugin method: garbage,
truncated, deeply nested and oversized payloads, and payloads of many small entries. Each costs
only its own call (an answer with no changes, or for Configure and Synchronize an error status);
the session stays up and the next well-formed call is answered as usual. And a hostile runtime
as a peer: one that sends requests and never reads the replies (the plugin drops what is past its
bounds, closes the session and registers again), and one that floods a Synchronize with chunks
(refused past the bytes bound; the next Synchronize is served).

The plugin is the real ``NriPlugin`` and ``NriEngine`` with every built-in plugin, on a real unix
socket against the fake runtime of ``tests/runtime_proxy/nri/fake_runtime.py``."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from cri_protos import nri_pb2, ttrpc_pb2
from hooks.manager import make_plugin_manager, plugin_order
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.nri import mux, ttrpc
from runtime_proxy.nri.adapter import NriEngine
from runtime_proxy.nri.connection import MAX_INFLIGHT, PLUGIN_SERVICE
from runtime_proxy.nri.plugin import MAX_EVENT_PAYLOAD, MAX_SYNC_BYTES, NriPlugin, PluginIdentity
from tests.runtime_proxy.nri.fake_runtime import FakeRuntime, Session

E = nri_pb2.Event
LSR_ANNOTATIONS = {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "1"})}
LSR_LABELS = {"koordinator.sh/qosClass": "LSR"}


def _pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> Any:
    pod = nri_pb2.PodSandbox(id="sb1", name="web", uid="u1", namespace="default",
                             labels=labels or {}, annotations=annotations or {})
    pod.linux.cgroup_parent = "/kubepods/burstable/podu1"
    return pod


def _container(cid: str = "c1") -> Any:
    container = nri_pb2.Container(id=cid, pod_sandbox_id="sb1", name="app", state=nri_pb2.CONTAINER_RUNNING)
    container.linux.resources.cpu.cpus = "0"
    container.linux.resources.cpu.quota.value = 50_000
    return container


def _with_pod(pod: Any) -> dict[str, Callable[[], Any]]:
    """A well-formed request of every pod or container method, around ``pod``."""
    container = _container()
    return {
        "CreateContainer": lambda: nri_pb2.CreateContainerRequest(pod=pod, container=container),
        "UpdateContainer": lambda: nri_pb2.UpdateContainerRequest(pod=pod, container=container),
        "StopContainer": lambda: nri_pb2.StopContainerRequest(pod=pod, container=container),
        "StateChange": lambda: nri_pb2.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=pod),
        "RunPodSandbox": lambda: nri_pb2.RunPodSandboxRequest(pod=pod),
        "StopPodSandbox": lambda: nri_pb2.StopPodSandboxRequest(pod=pod),
        "RemovePodSandbox": lambda: nri_pb2.RemovePodSandboxRequest(pod=pod),
        "PostCreateContainer": lambda: nri_pb2.PostCreateContainerRequest(pod=pod, container=container),
        "StartContainer": lambda: nri_pb2.StartContainerRequest(pod=pod, container=container),
        "PostStartContainer": lambda: nri_pb2.PostStartContainerRequest(pod=pod, container=container),
        "PostUpdateContainer": lambda: nri_pb2.PostUpdateContainerRequest(pod=pod, container=container),
        "RemoveContainer": lambda: nri_pb2.RemoveContainerRequest(pod=pod, container=container),
    }


EVENT_METHODS = tuple(_with_pod(_pod()))
SESSION_METHODS = ("Configure", "Synchronize")


def _garbage(method: str) -> bytes:
    return b"\xff" * 64


def _truncated(method: str) -> bytes:
    whole = _with_pod(_pod(LSR_ANNOTATIONS, LSR_LABELS))[method]().SerializeToString()
    return bytes(whole[: len(whole) // 2 + 1])


def _deeply_nested(method: str) -> bytes:
    # 100 000 nested start-group tags, then their end tags: no parser recursion may follow them.
    return b"\x0b" * 100_000 + b"\x0c" * 100_000


def _oversized(method: str) -> bytes:
    return _with_pod(_pod({"big": "x" * MAX_EVENT_PAYLOAD}))[method]().SerializeToString()


PAYLOADS = [
    pytest.param(_garbage, id="bytes that are no protobuf message"),
    pytest.param(_truncated, id="a well-formed request cut in half"),
    pytest.param(_deeply_nested, id="a hundred thousand nested groups"),
    pytest.param(_oversized, id="a pod with a 1 MiB annotation, over the per-event bound"),
]


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[FakeRuntime]:
    fake = await FakeRuntime(tmp_path / "nri.sock").start()
    yield fake
    await fake.stop()


@pytest.fixture
async def session(runtime: FakeRuntime) -> AsyncIterator[Session]:
    """A registered, configured and synchronized session of the plugin with every built-in."""
    pm = make_plugin_manager(builtins=None, entry_points=False)
    pipeline = Pipeline(plugin_steps(pm, [(name, "Ignore", 2.0) for name in plugin_order(pm)]))
    plugin = NriPlugin(PluginIdentity("rhp-hostile", "05"), NriEngine(pipeline), socket_path=str(runtime.path),
                       backoff=(0.05, 0.2))
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    live = await runtime.next_session()
    await asyncio.wait_for(live.registered.wait(), 5)
    await live.call("Configure", nri_pb2.ConfigureRequest(runtime_name="fake"))
    await live.call("Synchronize", nri_pb2.SynchronizeRequest())
    yield live
    stop.set()
    await asyncio.wait_for(task, 5)


async def _still_serves(session: Session) -> None:
    """The session is up and a well-formed create of an LSR pod gets its bound cpuset."""
    assert not session.closed.is_set()
    lsr = _pod(LSR_ANNOTATIONS, LSR_LABELS)
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=lsr, container=_container("ok")))
    assert not reply.HasField("status"), reply.status
    adjust = nri_pb2.CreateContainerResponse.FromString(reply.payload).adjust
    assert (adjust.linux.resources.cpu.cpus, adjust.linux.resources.cpu.quota.value) == ("1", -1)


@pytest.mark.parametrize("method", EVENT_METHODS)
@pytest.mark.parametrize("make", PAYLOADS)
async def test_a_hostile_event_payload_costs_only_its_call(
    session: Session, method: str, make: Callable[[str], bytes]
) -> None:
    reply = await session.call(method, make(method), timeout=10.0)
    assert not reply.HasField("status") and reply.payload == b""  # no changes
    await _still_serves(session)


@pytest.mark.parametrize("method", SESSION_METHODS)
@pytest.mark.parametrize("make", [pytest.param(_garbage, id="bytes that are no protobuf message"),
                                  pytest.param(_deeply_nested, id="a hundred thousand nested groups")])
async def test_a_hostile_configure_or_synchronize_is_an_error_status(
    session: Session, method: str, make: Callable[[str], bytes]
) -> None:
    """The runtime then drops the session and the plugin registers again; a payload over the
    14 MiB request bound never reaches a method (the session closes: ``test_plugin_session.py``)."""
    reply = await session.call(method, make(method), timeout=10.0)
    assert reply.HasField("status") and reply.status.code == 3, reply
    await _still_serves(session)


@pytest.mark.parametrize(
    "method",
    [pytest.param("CreateContainer", id="a create"), pytest.param("RunPodSandbox", id="a pod start")],
)
async def test_many_small_entries_within_the_bound_are_served(session: Session, method: str) -> None:
    """40 000 annotations (under the 1 MiB bound) are decoded off the event loop and served."""
    many = {f"example.com/k{i}": "v" for i in range(40_000)} | LSR_ANNOTATIONS
    payload = _with_pod(_pod(many, LSR_LABELS))[method]().SerializeToString()
    assert len(payload) < MAX_EVENT_PAYLOAD
    reply = await session.call(method, payload, timeout=10.0)
    assert not reply.HasField("status"), reply.status
    if method == "CreateContainer":
        adjust = nri_pb2.CreateContainerResponse.FromString(reply.payload).adjust
        assert adjust.linux.resources.cpu.cpus == "1"
    await _still_serves(session)


# -- a runtime that never reads our replies -------------------------------------------------------


def _limit_hits(limit: str) -> float:
    return REGISTRY.get_sample_value("rhp_nri_limit_hits_total", {"limit": limit}) or 0.0


class NeverReads:
    """A runtime that answers the plugin's RegisterPlugin, then sends StartContainer events, as
    fast as the plugin takes them, and never reads another byte. Its later sessions do the same."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.sessions = asyncio.Queue[None]()
        self.tasks: set[asyncio.Task[Any]] = set()

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        frames, messages = mux.FrameDecoder(), ttrpc.MessageDecoder()
        register: ttrpc.Message | None = None
        while register is None and (data := await reader.read(65536)):
            for conn_id, payload in frames.feed(data):
                found = messages.feed(payload) if conn_id == mux.RUNTIME_CONN else []
                register = found[0] if found else register
        if register is None:
            return
        writer.transport.pause_reading()  # from here on not a byte is read
        writer.write(mux.encode(mux.RUNTIME_CONN, ttrpc.encode_message(
            register.stream_id, ttrpc.TYPE_RESPONSE, ttrpc_pb2.Response().SerializeToString())))
        self.sessions.put_nowait(None)
        event = nri_pb2.StartContainerRequest(pod=_pod(), container=_container()).SerializeToString()
        index = len(self.sent)
        self.sent.append(0)
        try:
            while self.sent[index] < 1_000_000:
                request = ttrpc_pb2.Request(service=PLUGIN_SERVICE, method="StartContainer", payload=event,
                                            timeout_nano=2_000_000_000).SerializeToString()
                stream_id = 2 * self.sent[index] + 1
                writer.write(mux.encode(mux.PLUGIN_CONN, ttrpc.encode_message(stream_id, ttrpc.TYPE_REQUEST, request)))
                await writer.drain()
                self.sent[index] += 1
        except (ConnectionError, OSError):
            pass  # the plugin closed the session
        finally:
            writer.close()


async def _small_send_buffer(path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """The plugin's end of the socket with a small send buffer, so that a peer that does not read
    stops taking our replies after a few hundred of them."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, path)
    return await asyncio.open_unix_connection(sock=sock)


async def test_a_runtime_that_never_reads_costs_bounded_memory_and_its_session_is_closed(tmp_path: Path) -> None:
    """Requests past the bound of those in flight are dropped (no task each), the first reply
    the runtime does not take within the write timeout closes the session, and the plugin
    registers again."""
    peer = NeverReads()
    server = await asyncio.start_unix_server(peer.accept, path=str(tmp_path / "nri.sock"))
    pm = make_plugin_manager(builtins=None, entry_points=False)
    pipeline = Pipeline(plugin_steps(pm, [(name, "Ignore", 2.0) for name in plugin_order(pm)]))
    engine = NriEngine(pipeline, background=True)
    plugin = NriPlugin(PluginIdentity("rhp-hostile", "05"), engine, socket_path=str(tmp_path / "nri.sock"),
                       backoff=(0.05, 0.2), connect=_small_send_buffer)
    dropped, stalled = _limit_hits("requests_in_flight"), _limit_hits("write_timeout")
    before = len(asyncio.all_tasks())
    most = 0
    stop = asyncio.Event()
    task = asyncio.create_task(plugin.run(stop))
    try:
        async with asyncio.timeout(30):
            await peer.sessions.get()
            first = plugin.connection
            assert first is not None
            while not first.closed.is_set():
                most = max(most, len(asyncio.all_tasks()))
                await asyncio.sleep(0.002)
            await peer.sessions.get()  # registered again
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await engine.close()
        await peer.stop()
        server.close()
        await server.wait_closed()
    assert first.close_reason == "write stalled for 2 s"
    assert first.dropped_requests > 10 * MAX_INFLIGHT  # far more requests than are handled at once ...
    # ... yet never more tasks than that bound (a handler may run one of its own) and the session's.
    assert most <= before + 2 * MAX_INFLIGHT + 10
    assert _limit_hits("requests_in_flight") >= dropped + first.dropped_requests
    assert _limit_hits("write_timeout") >= stalled + 1


# -- a Synchronize flood ---------------------------------------------------------------------------


def _sync_chunk(index: int, size: int, more: bool) -> bytes:
    """A Synchronize message of about ``size`` bytes: one pod whose annotation fills it."""
    pod = nri_pb2.PodSandbox(id=f"flood-{index}", name=f"flood-{index}", uid=f"uid-flood-{index}",
                             namespace="default", annotations={"example.com/filler": "x" * size})
    return nri_pb2.SynchronizeRequest(pods=[pod], more=more).SerializeToString()


@pytest.fixture
async def plugin(runtime: FakeRuntime) -> AsyncIterator[NriPlugin]:
    engine = NriEngine(Pipeline([]), background=True)
    nri = NriPlugin(PluginIdentity("rhp-hostile", "05"), engine, socket_path=str(runtime.path), backoff=(0.05, 0.2))
    stop = asyncio.Event()
    task = asyncio.create_task(nri.run(stop))
    yield nri
    stop.set()
    await asyncio.wait_for(task, 10)
    await engine.close()


async def _configured(runtime: FakeRuntime) -> Session:
    session = await runtime.next_session()
    await asyncio.wait_for(session.registered.wait(), 5)
    await session.call("Configure", nri_pb2.ConfigureRequest(runtime_name="flood"))
    return session


async def _synchronizes_again(runtime: FakeRuntime, plugin: NriPlugin) -> None:
    """The plugin registers again and a well-formed Synchronize is served."""
    again = await _configured(runtime)
    last = await again.call("Synchronize", nri_pb2.SynchronizeRequest(pods=[_pod()], containers=[_container()]))
    assert not last.HasField("status") and plugin.synchronized.is_set()
    assert isinstance(plugin.events, NriEngine) and [p.sandbox_id for p in plugin.events.store.pods()] == ["sb1"]


async def test_a_synchronize_flood_is_closed_at_the_chunk_past_its_bytes_and_the_next_synchronize_works(
    runtime: FakeRuntime, plugin: NriPlugin
) -> None:
    """Chunks of 6 MiB with ``more``, each under the 14 MiB request bound: after two the
    Synchronize has 4 MiB left, so the third one's header closes the session before its body is
    read, and what was kept is dropped; the plugin registers again."""
    closed = _limit_hits("message_size")
    session = await _configured(runtime)
    answered = 0
    with pytest.raises(ConnectionError):
        for index in range(40):
            reply = await session.call("Synchronize", _sync_chunk(index, 6 << 20, more=True), timeout=30)
            assert not reply.HasField("status"), reply.status
            answered += 1
            assert plugin.sync_bytes <= MAX_SYNC_BYTES
    assert answered == 2 and session.closed.is_set()
    assert _limit_hits("message_size") == closed + 1
    await _synchronizes_again(runtime, plugin)


async def test_a_chunk_past_the_synchronize_bytes_within_the_header_slack_is_refused_with_a_status(
    runtime: FakeRuntime, plugin: NriPlugin
) -> None:
    """10 MiB, then 6 MiB and a little more: the header check leaves room for the envelope, the
    bytes bound does not; RESOURCE_EXHAUSTED, the chunks kept are dropped, the session closes."""
    refused = _limit_hits("synchronize_bytes")
    session = await _configured(runtime)
    first = await session.call("Synchronize", _sync_chunk(0, 10 << 20, more=True), timeout=30)
    assert not first.HasField("status")
    second = await session.call("Synchronize", _sync_chunk(1, (6 << 20) + (16 << 10), more=True), timeout=30)
    assert second.status.code == 8 and "limit" in second.status.message
    assert plugin.sync_bytes == 0
    assert _limit_hits("synchronize_bytes") == refused + 1
    await asyncio.wait_for(session.closed.wait(), 10)
    await _synchronizes_again(runtime, plugin)


async def test_a_synchronize_of_many_chunks_within_the_bound_is_served(runtime: FakeRuntime, plugin: NriPlugin) -> None:
    session = await _configured(runtime)
    for index in range(3):
        reply = await session.call("Synchronize", _sync_chunk(index, 4 << 20, more=True), timeout=30)
        assert nri_pb2.SynchronizeResponse.FromString(reply.payload).more
    last = await session.call("Synchronize", nri_pb2.SynchronizeRequest(pods=[_pod()]), timeout=30)
    assert not last.HasField("status") and plugin.sync_bytes == 0
    assert isinstance(plugin.events, NriEngine)
    assert sorted(p.sandbox_id for p in plugin.events.store.pods()) == ["flood-0", "flood-1", "flood-2", "sb1"]
