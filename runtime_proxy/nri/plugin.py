"""The NRI plugin session: register, subscribe, dispatch the Plugin methods to an ``Events``
implementation, and reconnect when the runtime goes away.

Sequence per session: connect to the runtime's socket, start reading, call RegisterPlugin on
connection 2 (the runtime may send Configure before it answers; the reader never waits), answer
Configure with the event mask, answer Synchronize (chunks with ``more`` get ``more`` and no
updates; updates go only in the final reply), then answer events until the socket closes. The
runtime never sends Shutdown on restart; the socket just closes, and ``run`` dials again with
backoff and registers under the same name.

Synchronize. The chunks of one Synchronize (containerd 2.x splits one over 4 MiB into messages
with ``more``) are kept until the last one, bounded by ``MAX_SYNC_BYTES`` (16 MiB of payload
across the chunks: what containerd 1.7 can send in its one message, ``MAX_RECV_MESSAGE``, and
the envelopes of the split) and 100 000 pods and containers. While a split Synchronize is in
progress the connection accepts requests of at most the bytes it has left (never less than an
event's bound), so a chunk that would pass the bytes bound closes the session as soon as its
header announces it, before its body is read (``rhp_nri_limit_hits_total{limit=
"message_size"}``). A chunk that passes either bound anyway (the header check leaves room for
the envelope and for one event) is refused before it is decoded: the reply is
RESOURCE_EXHAUSTED (``limit="synchronize_bytes"`` or ``"synchronize_objects"``) and the session
is closed once it is sent. Either way the chunks kept so far are dropped, containerd closes the
plugin (as it does on any failed Synchronize), the plugin registers again, and the next
Synchronize within the bounds is served as usual.

Payloads. Each call's payload is decoded by the one protobuf parser of its message type, under
a bound per method: the events of one pod or container (``MAX_EVENT_PAYLOAD``, 1 MiB: Kubernetes
caps a pod's annotations at 256 KiB) and Configure and Synchronize (the bound of a request,
``ttrpc.MAX_RECV_MESSAGE``). A payload over its bound, or one that does not decode, costs only its call
(``SkipCall``: answered with no changes and a warning; for Configure and Synchronize an error
status, so the runtime drops the session and the plugin registers again). Payloads over
``DECODE_ON_LOOP`` are decoded in a worker thread, so a large one never holds the event loop.

Events. ``SUBSCRIBED`` lists events 1..11 only: they are valid on every runtime with NRI v0.3 or
later (containerd 1.7 and 2.x); a bit the runtime does not know gets the plugin dropped. The
plugin subscribes to the part of them its ``Events`` want (``wanted_events``, when it has one:
the runtime then does not wait on calls that change nothing); when the wanted set grows (a hook
server registered for a stage after Configure), the session is closed, so the plugin registers
again with the larger set and is synchronized anew. Runtimes
before NRI v0.12 deliver pod events and PostCreate/Start/PostStart/PostUpdate/RemoveContainer
through StateChange; v0.12 has a method for each. Both reach the same ``Events`` method.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import structlog
from google.protobuf.message import DecodeError, Message

from cri_protos import nri_pb2
from runtime_proxy import metrics
from runtime_proxy.nri.connection import NriConnection, RpcError, SkipCall, Unimplemented
from runtime_proxy.nri.ttrpc import MAX_RECV_MESSAGE

_M = TypeVar("_M", bound=Message)
log = structlog.get_logger(__name__)

__all__ = ["MAX_SYNC_BYTES", "MAX_SYNC_OBJECTS", "SUBSCRIBED", "Events", "NriPlugin", "PluginIdentity", "event_mask"]

DEFAULT_SOCKET = "/var/run/nri/nri.sock"
NAME_RE = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
IDX_RE = re.compile(r"[0-9]{2}")

MAX_EVENT_PAYLOAD = 1 << 20
MAX_SYNC_BYTES = 16 << 20
MAX_SYNC_OBJECTS = 100_000
RESOURCE_EXHAUSTED = 8
# What a ttrpc Request adds around its payload (service, method, timeout, metadata), with room.
ENVELOPE = 64 << 10
DECODE_ON_LOOP = 64 << 10
INVALID_ARGUMENT = 3

E = nri_pb2.Event
SUBSCRIBED: tuple[int, ...] = (
    E.RUN_POD_SANDBOX,
    E.STOP_POD_SANDBOX,
    E.REMOVE_POD_SANDBOX,
    E.CREATE_CONTAINER,
    E.POST_CREATE_CONTAINER,
    E.START_CONTAINER,
    E.POST_START_CONTAINER,
    E.UPDATE_CONTAINER,
    E.POST_UPDATE_CONTAINER,
    E.STOP_CONTAINER,
    E.REMOVE_CONTAINER,
)


def event_mask(events: tuple[int, ...]) -> int:
    mask = 0
    for event in events:
        mask |= 1 << (event - 1)
    return mask


class Events(Protocol):
    """What the plugin does on each runtime event (``runtime_proxy.nri.adapter.NriEngine``)."""

    async def configure(self, request: nri_pb2.ConfigureRequest) -> None: ...

    async def synchronize(
        self, pods: list[nri_pb2.PodSandbox], containers: list[nri_pb2.Container]
    ) -> list[nri_pb2.ContainerUpdate]: ...

    async def create_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> nri_pb2.CreateContainerResponse: ...

    async def update_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container, resources: nri_pb2.LinuxResources
    ) -> list[nri_pb2.ContainerUpdate]: ...

    async def stop_container(
        self, pod: nri_pb2.PodSandbox, container: nri_pb2.Container
    ) -> list[nri_pb2.ContainerUpdate]: ...

    async def state_change(
        self, event: int, pod: nri_pb2.PodSandbox, container: nri_pb2.Container | None
    ) -> None: ...

    def session_ended(self) -> None: ...


@dataclass(frozen=True)
class PluginIdentity:
    name: str
    idx: str

    def __post_init__(self) -> None:
        if not NAME_RE.fullmatch(self.name):
            raise ValueError(f"plugin name {self.name!r}: 1-64 of A-Z a-z 0-9 _ . + -")
        if not IDX_RE.fullmatch(self.idx):
            raise ValueError(f"plugin index {self.idx!r}: exactly two digits")


# Dedicated (NRI v0.12) methods that carry {pod, container} and map onto a StateChange event.
_StateRequest = (
    nri_pb2.RunPodSandboxRequest | nri_pb2.StopPodSandboxRequest | nri_pb2.RemovePodSandboxRequest
    | nri_pb2.PostCreateContainerRequest | nri_pb2.StartContainerRequest | nri_pb2.PostStartContainerRequest
    | nri_pb2.PostUpdateContainerRequest | nri_pb2.RemoveContainerRequest
)
_STATE_METHODS: dict[str, tuple[type[_StateRequest], int]] = {
    "RunPodSandbox": (nri_pb2.RunPodSandboxRequest, E.RUN_POD_SANDBOX),
    "StopPodSandbox": (nri_pb2.StopPodSandboxRequest, E.STOP_POD_SANDBOX),
    "RemovePodSandbox": (nri_pb2.RemovePodSandboxRequest, E.REMOVE_POD_SANDBOX),
    "PostCreateContainer": (nri_pb2.PostCreateContainerRequest, E.POST_CREATE_CONTAINER),
    "StartContainer": (nri_pb2.StartContainerRequest, E.START_CONTAINER),
    "PostStartContainer": (nri_pb2.PostStartContainerRequest, E.POST_START_CONTAINER),
    "PostUpdateContainer": (nri_pb2.PostUpdateContainerRequest, E.POST_UPDATE_CONTAINER),
    "RemoveContainer": (nri_pb2.RemoveContainerRequest, E.REMOVE_CONTAINER),
}


async def _decode(method: str, message_type: type[_M], payload: bytes, limit: int = MAX_EVENT_PAYLOAD,
                  *, fatal: bool = False) -> _M:
    """``payload`` parsed as ``message_type``, at most ``limit`` bytes, off the event loop when
    larger than ``DECODE_ON_LOOP``. A payload over the bound or undecodable raises ``SkipCall``,
    or with ``fatal`` an ``RpcError`` (INVALID_ARGUMENT)."""
    problem = ""
    if len(payload) > limit:
        problem = f"{method}: payload of {len(payload)} bytes (limit {limit})"
    else:
        try:
            if len(payload) > DECODE_ON_LOOP:
                return await asyncio.to_thread(message_type.FromString, payload)
            return message_type.FromString(payload)
        except DecodeError as exc:
            problem = f"{method}: undecodable payload ({exc})"
    if fatal:
        raise RpcError(INVALID_ARGUMENT, problem)
    raise SkipCall(problem)


class NriPlugin:
    """Dispatches one session's Plugin calls to ``events``; ``run`` keeps sessions going."""

    def __init__(
        self,
        identity: PluginIdentity,
        events: Events,
        *,
        socket_path: str = DEFAULT_SOCKET,
        backoff: tuple[float, float] = (0.5, 10.0),
        connect: Callable[[str], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] | None = None,
    ) -> None:
        self.identity = identity
        self.events = events
        self.socket_path = socket_path
        self.backoff = backoff
        self._connect = connect or asyncio.open_unix_connection
        self.connection: NriConnection | None = None
        self.configured = asyncio.Event()
        self.synchronized = asyncio.Event()
        self.sessions = 0
        self._sync_pods: list[nri_pb2.PodSandbox] = []
        self._sync_containers: list[nri_pb2.Container] = []
        self.subscribed = 0
        self._sync_chunks = 0
        # Payload bytes of the chunks of the Synchronize in progress.
        self.sync_bytes = 0

    # -- dispatch ------------------------------------------------------------------------------

    async def handle(self, method: str, payload: bytes) -> bytes:
        log.debug("NRI call", method=method, size=len(payload))
        if method == "Configure":
            configure = await _decode(method, nri_pb2.ConfigureRequest, payload, MAX_RECV_MESSAGE, fatal=True)
            log.info("NRI configure", runtime=configure.runtime_name, version=configure.runtime_version,
                     nri_version=configure.NRI_version, request_timeout_ms=configure.request_timeout)
            if configure.request_timeout > 0 and self.connection is not None:
                self.connection.default_timeout = configure.request_timeout / 1000
            await self.events.configure(configure)
            self.subscribed = self.wanted_mask()
            self.configured.set()
            return nri_pb2.ConfigureResponse(events=self.subscribed).SerializeToString()
        if method == "Synchronize":
            size = self.sync_bytes + len(payload)
            if size > MAX_SYNC_BYTES:
                self._refuse_sync("synchronize_bytes", f"{size} bytes in {self._sync_chunks + 1} messages "
                                                       f"(limit {MAX_SYNC_BYTES})")
            self.sync_bytes = size
            sync = await _decode(method, nri_pb2.SynchronizeRequest, payload, MAX_RECV_MESSAGE, fatal=True)
            del payload  # the decoded message holds what is used; a large chunk is not kept twice
            return await self._synchronize(sync)
        if method == "Shutdown":
            log.info("NRI runtime announced shutdown")
            return nri_pb2.Empty().SerializeToString()
        self._check_subscription()
        if method == "CreateContainer":
            create = await _decode(method, nri_pb2.CreateContainerRequest, payload)
            reply = await self.events.create_container(create.pod, create.container)
            return bytes(reply.SerializeToString())
        if method == "UpdateContainer":
            update = await _decode(method, nri_pb2.UpdateContainerRequest, payload)
            updates = await self.events.update_container(update.pod, update.container, update.linux_resources)
            return nri_pb2.UpdateContainerResponse(update=updates).SerializeToString()
        if method == "StopContainer":
            stop = await _decode(method, nri_pb2.StopContainerRequest, payload)
            updates = await self.events.stop_container(stop.pod, stop.container)
            return nri_pb2.StopContainerResponse(update=updates).SerializeToString()
        if method == "StateChange":
            change = await _decode(method, nri_pb2.StateChangeEvent, payload)
            container = change.container if change.HasField("container") else None
            await self.events.state_change(change.event, change.pod, container)
            return nri_pb2.Empty().SerializeToString()
        if method in _STATE_METHODS:
            request_type, event = _STATE_METHODS[method]
            request = await _decode(method, request_type, payload)
            only: nri_pb2.Container | None = getattr(request, "container", None)
            await self.events.state_change(event, request.pod, only)
            return b""
        raise Unimplemented(method)

    def wanted_mask(self) -> int:
        wanted = getattr(self.events, "wanted_events", None)
        events = SUBSCRIBED if wanted is None else tuple(e for e in wanted() if e in SUBSCRIBED)
        return event_mask(events)

    def _check_subscription(self) -> None:
        """Close the session when the events wanted now are more than those subscribed to."""
        connection = self.connection
        if connection is None or not self.subscribed or connection.closed.is_set():
            return
        grown = self.wanted_mask() & ~self.subscribed
        if grown:
            log.info("NRI events wanted grew; registering again", subscribed=hex(self.subscribed),
                     more=hex(grown))
            self.subscribed = 0
            connection.close_when_idle("event subscription grew")

    def _reset_sync(self) -> None:
        self._sync_pods, self._sync_containers, self._sync_chunks, self.sync_bytes = [], [], 0, 0
        if self.connection is not None:
            self.connection.limit_requests(None)

    def _refuse_sync(self, limit: str, what: str) -> None:
        """Refuse the Synchronize in progress (see the module docstring); raises ``RpcError``."""
        chunks = self._sync_chunks + 1
        self._reset_sync()
        metrics.NRI_LIMIT_HITS.labels(limit).inc()
        log.warning("NRI Synchronize over its bound refused; the session closes and the plugin registers again",
                    limit=limit, what=what, messages=chunks)
        if self.connection is not None:
            self.connection.close_when_idle(f"synchronize refused: {what}")
        raise RpcError(RESOURCE_EXHAUSTED, f"synchronize refused: {what}")

    async def _synchronize(self, request: nri_pb2.SynchronizeRequest) -> bytes:
        objects = len(self._sync_pods) + len(self._sync_containers) + len(request.pods) + len(request.containers)
        if objects > MAX_SYNC_OBJECTS:
            self._refuse_sync("synchronize_objects", f"{objects} pods and containers (limit {MAX_SYNC_OBJECTS})")
        self._sync_chunks += 1
        self._sync_pods.extend(request.pods)
        self._sync_containers.extend(request.containers)
        if request.more:
            if self.connection is not None:
                left = MAX_SYNC_BYTES - self.sync_bytes
                self.connection.limit_requests(max(left, MAX_EVENT_PAYLOAD) + ENVELOPE)
            return nri_pb2.SynchronizeResponse(more=True).SerializeToString()
        pods, containers, chunks, size = self._sync_pods, self._sync_containers, self._sync_chunks, self.sync_bytes
        self._reset_sync()
        updates = await self.events.synchronize(pods, containers)
        self.synchronized.set()
        log.info("NRI synchronized", pods=len(pods), containers=len(containers), updates=len(updates),
                 messages=chunks, size=size)
        return nri_pb2.SynchronizeResponse(update=updates).SerializeToString()

    # -- sessions ------------------------------------------------------------------------------

    async def session(self) -> None:
        """One session: connect, register, serve until the socket closes."""
        try:
            reader, writer = await self._connect(self.socket_path)
        except FileNotFoundError:
            raise ConnectionError(f"no NRI socket at {self.socket_path}: is NRI enabled in the runtime "
                                  "(containerd 1.7: [plugins.\"io.containerd.nri.v1.nri\"] disable = false)?") from None
        except OSError as exc:
            raise ConnectionError(f"cannot connect to the NRI socket {self.socket_path}: "
                                  f"{exc.strerror or exc}") from None
        connection = NriConnection(reader, writer, self.handle)
        self.connection = connection
        self.subscribed = 0
        self._reset_sync()
        self.configured.clear()
        self.synchronized.clear()
        reading = asyncio.create_task(connection.serve())
        try:
            register = nri_pb2.RegisterPluginRequest(plugin_name=self.identity.name, plugin_idx=self.identity.idx)
            await connection.call("RegisterPlugin", register.SerializeToString(), timeout=5.0)
            self.sessions += 1
            log.info("NRI plugin registered", name=self.identity.name, idx=self.identity.idx, socket=self.socket_path)
            await reading
        finally:
            if not reading.done():
                await connection.close("session ended")
                reading.cancel()
            self.events.session_ended()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Sessions until ``stop`` is set, re-dialling with exponential backoff."""
        stop = stop or asyncio.Event()
        first, limit = self.backoff
        delay = first
        while not stop.is_set():
            before = self.sessions
            session = asyncio.create_task(self.session())
            stopping = asyncio.create_task(stop.wait())
            try:
                done, _ = await asyncio.wait({session, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            if session not in done:
                session.cancel()
                await asyncio.gather(session, return_exceptions=True)
                break
            error = session.exception()
            if self.sessions > before:
                delay = first
            log.warning("NRI session ended; reconnecting", error=str(error) if error else None, socket=self.socket_path,
                        retry_in=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            delay = min(delay * 2, limit)
        if self.connection is not None:
            await self.connection.close("stopped")
