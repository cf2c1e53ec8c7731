"""The NRI session against a fake runtime over a real unix socket: registration, early
Configure, dispatch, bounds, split Synchronize and reconnect."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from cri_protos import nri_pb2, ttrpc_pb2
from runtime_proxy.nri import mux, ttrpc
from runtime_proxy.nri.connection import PLUGIN_SERVICE, NriConnection
from runtime_proxy.nri.plugin import SUBSCRIBED, NriPlugin, PluginIdentity, event_mask
from tests.runtime_proxy.nri.fake_runtime import FakeRuntime, Session

E = nri_pb2.Event


class RecordingEvents:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.sync_updates: list[Any] = []
        self.plugin: NriPlugin | None = None
        self.create_delay = 0.0
        self.call_runtime_in_handler = False
        self.handler_error: BaseException | None = None
        self.annotations: dict[str, str] = {}

    async def configure(self, request: Any) -> None:
        self.calls.append(("configure", request.runtime_name))

    async def synchronize(self, pods: list[Any], containers: list[Any]) -> list[Any]:
        self.calls.append(("synchronize", [p.id for p in pods], [c.id for c in containers]))
        return self.sync_updates

    async def create_container(self, pod: Any, container: Any) -> Any:
        self.calls.append(("create", pod.id, container.id))
        if self.create_delay:
            await asyncio.sleep(self.create_delay)
        if self.call_runtime_in_handler:
            assert self.plugin is not None and self.plugin.connection is not None
            try:
                await self.plugin.connection.call("UpdateContainers", b"")
            except BaseException as exc:
                self.handler_error = exc
                raise
        reply = nri_pb2.CreateContainerResponse()
        reply.adjust.annotations.update(self.annotations)
        return reply

    async def update_container(self, pod: Any, container: Any, resources: Any) -> list[Any]:
        self.calls.append(("update", container.id, resources.cpu.cpus))
        return [nri_pb2.ContainerUpdate(container_id=container.id)]

    async def stop_container(self, pod: Any, container: Any) -> list[Any]:
        self.calls.append(("stop", container.id))
        return []

    async def state_change(self, event: int, pod: Any, container: Any | None) -> None:
        self.calls.append(("state", event, pod.id, container.id if container is not None else None))

    def session_ended(self) -> None:
        self.calls.append(("ended",))


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[FakeRuntime]:
    fake = await FakeRuntime(tmp_path / "nri.sock").start()
    yield fake
    await fake.stop()


@pytest.fixture
def events() -> RecordingEvents:
    return RecordingEvents()


@pytest.fixture
async def plugin(runtime: FakeRuntime, events: RecordingEvents) -> AsyncIterator[NriPlugin]:
    nri = NriPlugin(PluginIdentity("rhp-test", "07"), events, socket_path=str(runtime.path), backoff=(0.05, 0.2))
    events.plugin = nri
    stop = asyncio.Event()
    task = asyncio.create_task(nri.run(stop))
    yield nri
    stop.set()
    await asyncio.wait_for(task, 5)


async def _registered(runtime: FakeRuntime) -> Session:
    session = await runtime.next_session()
    await asyncio.wait_for(session.registered.wait(), 5)
    return session


def _pod(pod_id: str) -> Any:
    return nri_pb2.PodSandbox(id=pod_id, name=pod_id, uid=f"uid-{pod_id}", namespace="default")


def _container(container_id: str, pod_id: str = "p1") -> Any:
    return nri_pb2.Container(id=container_id, pod_sandbox_id=pod_id, name=container_id)


async def test_registers_with_its_name_and_index(runtime: FakeRuntime, plugin: NriPlugin) -> None:
    await _registered(runtime)
    assert [(r.plugin_name, r.plugin_idx) for r in runtime.registrations] == [("rhp-test", "07")]


async def test_configure_before_the_register_reply_is_answered(
    runtime: FakeRuntime, events: RecordingEvents, plugin: NriPlugin
) -> None:
    answers: list[Any] = []

    async def configure_first(session: Session) -> None:
        reply = await session.call("Configure", nri_pb2.ConfigureRequest(runtime_name="fake", request_timeout=2000))
        answers.append(nri_pb2.ConfigureResponse.FromString(reply.payload))

    runtime.before_register_reply = configure_first
    await _registered(runtime)
    assert [a.events for a in answers] == [event_mask(SUBSCRIBED)]
    assert ("configure", "fake") in events.calls


def test_event_mask_holds_only_events_every_nri_runtime_knows() -> None:
    # Events 1..11; containerd before NRI v0.10 drops a plugin that subscribes to 12 or later.
    assert event_mask(SUBSCRIBED) == (1 << 11) - 1


@pytest.mark.parametrize(
    ("service", "method"),
    [
        pytest.param("nri.pkg.api.v1alpha1.Plugin", "NoSuchMethod", id="an unknown method is Unimplemented"),
        pytest.param("some.other.Service", "Configure", id="an unknown service is Unimplemented"),
        pytest.param("nri.pkg.api.v1alpha1.Plugin", "ValidateContainerAdjustment",
                     id="a newer method we do not implement is Unimplemented"),
    ],
)
async def test_unknown_calls_get_unimplemented(
    runtime: FakeRuntime, plugin: NriPlugin, service: str, method: str
) -> None:
    session = await _registered(runtime)
    reply = await session.call(method, b"", service=service)
    assert reply.status.code == ttrpc.CODE_UNIMPLEMENTED
    assert not session.closed.is_set()


async def test_frames_for_unknown_connections_are_dropped(runtime: FakeRuntime, plugin: NriPlugin) -> None:
    session = await _registered(runtime)
    session.send(7, b"garbage for a connection nobody has")
    session.send(0, b"connection 0 is reserved")
    reply = await session.call("StateChange", nri_pb2.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=_pod("p1")))
    assert reply.status.code == 0
    assert plugin.connection is not None and plugin.connection.dropped_frames == 2


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(struct.pack(">II", 1, mux.MAX_RECV_PAYLOAD + 1),
                     id="a frame header announcing more than the bound"),
        pytest.param(mux.encode(1, ttrpc.HEADER.pack(ttrpc.MAX_RECV_MESSAGE + 1, 1, 1, 0)),
                     id="a ttrpc header announcing more than the 14 MiB request bound"),
    ],
)
async def test_oversized_input_closes_the_session(runtime: FakeRuntime, plugin: NriPlugin, raw: bytes) -> None:
    session = await _registered(runtime)
    session.send_raw(raw)
    await asyncio.wait_for(session.closed.wait(), 5)
    # The plugin dials again and registers under the same name.
    await _registered(runtime)
    assert [r.plugin_name for r in runtime.registrations] == ["rhp-test", "rhp-test"]


async def test_split_synchronize_answers_more_and_updates_only_at_the_end(
    runtime: FakeRuntime, events: RecordingEvents, plugin: NriPlugin
) -> None:
    session = await _registered(runtime)
    events.sync_updates = [nri_pb2.ContainerUpdate(container_id="c1")]
    first = await session.call("Synchronize", nri_pb2.SynchronizeRequest(pods=[_pod("p1")], more=True))
    second = await session.call("Synchronize", nri_pb2.SynchronizeRequest(
        pods=[_pod("p2")], containers=[_container("c1")], more=True))
    last = await session.call("Synchronize", nri_pb2.SynchronizeRequest(containers=[_container("c2")]))
    for chunk in (first, second):
        reply = nri_pb2.SynchronizeResponse.FromString(chunk.payload)
        assert reply.more and not reply.update
    final = nri_pb2.SynchronizeResponse.FromString(last.payload)
    assert not final.more and [u.container_id for u in final.update] == ["c1"]
    assert ("synchronize", ["p1", "p2"], ["c1", "c2"]) in events.calls
    assert plugin.synchronized.is_set()


async def test_large_replies_go_out_in_frames_of_at_most_4096_bytes(
    runtime: FakeRuntime, events: RecordingEvents, plugin: NriPlugin
) -> None:
    session = await _registered(runtime)
    events.annotations = {f"key-{i}": "v" * 100 for i in range(200)}
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=_pod("p1"),
                                                                                  container=_container("c1")))
    adjust = nri_pb2.CreateContainerResponse.FromString(reply.payload).adjust
    assert len(adjust.annotations) == 200
    assert 0 < runtime.max_frame_seen <= 4096


async def test_calling_the_runtime_from_a_handler_is_refused(
    runtime: FakeRuntime, events: RecordingEvents, plugin: NriPlugin
) -> None:
    session = await _registered(runtime)
    events.call_runtime_in_handler = True
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=_pod("p1"),
                                                                                  container=_container("c1")))
    assert isinstance(events.handler_error, RuntimeError)
    assert reply.status.code == 0 and reply.payload == b""  # answered with no changes
    assert session.update_requests == []


async def test_a_slow_handler_is_answered_with_no_changes_within_the_runtimes_timeout(
    runtime: FakeRuntime, events: RecordingEvents, plugin: NriPlugin
) -> None:
    session = await _registered(runtime)
    events.create_delay = 5.0
    loop = asyncio.get_running_loop()
    started = loop.time()
    reply = await session.call("CreateContainer", nri_pb2.CreateContainerRequest(
        pod=_pod("p1"), container=_container("c1")), timeout_nano=300_000_000)
    assert reply.status.code == 0 and reply.payload == b""
    assert loop.time() - started < 2.0


@pytest.mark.parametrize(
    ("method", "request_message", "expected"),
    [
        pytest.param("StateChange", nri_pb2.StateChangeEvent(event=E.START_CONTAINER, pod=_pod("p1"),
                                                              container=_container("c1")),
                     ("state", E.START_CONTAINER, "p1", "c1"), id="StateChange carries a container event"),
        pytest.param("StateChange", nri_pb2.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=_pod("p1")),
                     ("state", E.RUN_POD_SANDBOX, "p1", None), id="StateChange carries a pod event"),
        pytest.param("StartContainer", nri_pb2.StartContainerRequest(pod=_pod("p1"), container=_container("c1")),
                     ("state", E.START_CONTAINER, "p1", "c1"), id="a dedicated StartContainer reaches the same place"),
        pytest.param("RunPodSandbox", nri_pb2.RunPodSandboxRequest(pod=_pod("p1")),
                     ("state", E.RUN_POD_SANDBOX, "p1", None), id="a dedicated RunPodSandbox reaches the same place"),
        pytest.param("RemoveContainer", nri_pb2.RemoveContainerRequest(pod=_pod("p1"), container=_container("c1")),
                     ("state", E.REMOVE_CONTAINER, "p1", "c1"), id="a dedicated RemoveContainer arrives too"),
        pytest.param("StopContainer", nri_pb2.StopContainerRequest(pod=_pod("p1"), container=_container("c1")),
                     ("stop", "c1"), id="StopContainer has its own call"),
    ],
)
async def test_events_reach_the_handlers(
    runtime: FakeRuntime, events: RecordingEvents, plugin: NriPlugin, method: str, request_message: Any,
    expected: tuple[Any, ...],
) -> None:
    session = await _registered(runtime)
    reply = await session.call(method, request_message)
    assert reply.status.code == 0
    assert expected in events.calls


async def test_update_container_reply_carries_the_updates(
    runtime: FakeRuntime, events: RecordingEvents, plugin: NriPlugin
) -> None:
    session = await _registered(runtime)
    request = nri_pb2.UpdateContainerRequest(pod=_pod("p1"), container=_container("c9"))
    request.linux_resources.cpu.cpus = "0-1"
    reply = await session.call("UpdateContainer", request)
    update = nri_pb2.UpdateContainerResponse.FromString(reply.payload)
    assert [u.container_id for u in update.update] == ["c9"]
    assert ("update", "c9", "0-1") in events.calls


async def test_undecodable_payload_is_an_error_reply_not_a_crash(runtime: FakeRuntime, plugin: NriPlugin) -> None:
    session = await _registered(runtime)
    reply = await session.call("CreateContainer", b"\xff\xff\xff")
    assert reply.payload == b"" and reply.status.code == 0
    assert not session.closed.is_set()


async def test_reconnects_after_the_runtime_closes_the_socket(
    runtime: FakeRuntime, events: RecordingEvents, plugin: NriPlugin
) -> None:
    first = await _registered(runtime)
    first.close()
    second = await _registered(runtime)
    reply = await second.call("Configure", nri_pb2.ConfigureRequest(runtime_name="again"))
    assert reply.status.code == 0
    assert [r.plugin_name for r in runtime.registrations] == ["rhp-test", "rhp-test"]
    assert ("ended",) in events.calls


async def test_keeps_dialling_while_the_socket_is_absent(tmp_path: Path, events: RecordingEvents) -> None:
    path = tmp_path / "later.sock"
    nri = NriPlugin(PluginIdentity("rhp-test", "07"), events, socket_path=str(path), backoff=(0.02, 0.05))
    stop = asyncio.Event()
    task = asyncio.create_task(nri.run(stop))
    await asyncio.sleep(0.15)
    fake = await FakeRuntime(path).start()
    try:
        await _registered(fake)
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await fake.stop()


@pytest.mark.parametrize(
    ("name", "idx"),
    [
        pytest.param("", "10", id="an empty name is refused"),
        pytest.param("has space", "10", id="a name with a space is refused"),
        pytest.param("ok", "1", id="a one-digit index is refused"),
        pytest.param("ok", "100", id="a three-digit index is refused"),
        pytest.param("ok", "ab", id="a non-numeric index is refused"),
    ],
)
def test_identity_is_checked_like_the_runtime_does(name: str, idx: str) -> None:
    with pytest.raises(ValueError):
        PluginIdentity(name, idx)


async def test_the_subscription_follows_the_wanted_events_and_a_larger_set_registers_again(
    runtime: FakeRuntime, events: RecordingEvents, plugin: NriPlugin
) -> None:
    wanted = [E.CREATE_CONTAINER]
    events.wanted_events = lambda: tuple(wanted)  # type: ignore[attr-defined]
    first = await _registered(runtime)
    reply = await first.call("Configure", nri_pb2.ConfigureRequest())
    configured = nri_pb2.ConfigureResponse.FromString(reply.payload)
    assert configured.events == event_mask((E.CREATE_CONTAINER,))
    wanted.append(E.POST_START_CONTAINER)  # e.g. a hook server registered for PostStartContainer
    await first.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=_pod("p1"), container=_container("c1")))
    await asyncio.wait_for(first.closed.wait(), 5)
    second = await _registered(runtime)
    reply = await second.call("Configure", nri_pb2.ConfigureRequest())
    configured = nri_pb2.ConfigureResponse.FromString(reply.payload)
    assert configured.events == event_mask((E.CREATE_CONTAINER, E.POST_START_CONTAINER))
    assert [r.plugin_name for r in runtime.registrations] == ["rhp-test", "rhp-test"]


async def _pair() -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter],
                           tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    ours, theirs = socket.socketpair()
    return await asyncio.open_unix_connection(sock=ours), await asyncio.open_unix_connection(sock=theirs)


def _request(stream_id: int, method: str, payload: bytes) -> bytes:
    request = ttrpc_pb2.Request(service=PLUGIN_SERVICE, method=method, payload=payload)
    return mux.encode(mux.PLUGIN_CONN, ttrpc.encode_message(stream_id, ttrpc.TYPE_REQUEST, request.SerializeToString()))


async def test_requests_past_the_bytes_in_flight_are_dropped_without_a_reply() -> None:
    release = asyncio.Event()
    handling: list[str] = []

    async def slow(method: str, payload: bytes) -> bytes:
        handling.append(method)
        await release.wait()
        return method.encode()

    (reader, writer), (peer_reader, peer_writer) = await _pair()
    connection = NriConnection(reader, writer, slow, max_inflight_bytes=1500)
    serving = asyncio.create_task(connection.serve())
    peer_writer.write(_request(1, "a", b"x" * 1000) + _request(3, "b", b"x" * 1000) + _request(5, "c", b"x" * 100))
    while len(handling) < 2:
        await asyncio.sleep(0.01)
    assert handling == ["a", "c"]  # b would pass the 1500 bytes in flight
    release.set()
    frames, messages, answered = mux.FrameDecoder(), ttrpc.MessageDecoder(), {}
    while len(answered) < 2:
        for _, payload in frames.feed(await asyncio.wait_for(peer_reader.read(65536), 5)):
            for msg in messages.feed(payload):
                answered[msg.stream_id] = ttrpc_pb2.Response.FromString(msg.payload).payload
    assert answered == {1: b"a", 5: b"c"} and connection.dropped_requests == 1
    peer_writer.close()
    await asyncio.wait_for(serving, 5)


async def test_a_stop_that_comes_with_the_reply_to_a_call_is_not_lost() -> None:
    """The caller is cancelled in the same turn as the reply arrives: the call raises
    CancelledError instead of returning the reply (asyncio.wait_for on Python 3.11 would)."""

    async def nothing(method: str, payload: bytes) -> bytes:
        return b""

    (reader, writer), _ = await _pair()
    connection = NriConnection(reader, writer, nothing)
    call = asyncio.create_task(connection.call("RegisterPlugin", b"", timeout=5))
    while not connection._pending:
        await asyncio.sleep(0)
    [reply] = connection._pending.values()
    reply.set_result(ttrpc_pb2.Response())
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await connection.close()
