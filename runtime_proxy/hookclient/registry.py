"""The registry of hook servers (``runtime_proxy.hookclient``'s "Registrations", "Trust",
"Order" and "Channels"): polls the registration directory, refuses unsafe files and sockets,
keeps one channel per endpoint and hands the pipeline one ``RemoteStep`` per server. Started by
``serve`` and ``nri``."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from rhp_ops.files import FileRefused, read_regular_file
from runtime_proxy import metrics
from runtime_proxy.engine.background import Background, every
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.hookclient.registration import (
    MAX_REGISTRATION_BYTES,
    Registration,
    RegistrationError,
    parse_registration,
    strip_unix,
)
from runtime_proxy.hookclient.step import RemoteStep

if TYPE_CHECKING:
    import grpc

log = structlog.get_logger(__name__)

__all__ = ["HookServerRegistry"]


POLL_INTERVAL = 0.5
_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]


# ---- the registry -----------------------------------------------------------------------------


# (mtime_ns, ctime_ns, size, inode, mode, uid) from lstat: any change re-reads the file.
_Signature = tuple[int, int, int, int, int, int]


def _signature(st: os.stat_result) -> _Signature:
    return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid)


@dataclass(frozen=True)
class _Refusal:
    """A registration file (or the directory) that is not read, and why."""

    reason: str  # the metric label: symlink, not-regular-file, owner, writable, too-large, unsafe-directory
    message: str


def _unsafe(st: os.stat_result, what: str) -> _Refusal | None:
    """Why a file or directory with this ``lstat`` may not be trusted, or None."""
    if stat.S_ISLNK(st.st_mode):
        return _Refusal("symlink", f"{what} is a symlink")
    if st.st_uid not in (0, os.geteuid()):
        return _Refusal("owner", f"{what} is owned by uid {st.st_uid}, not root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return _Refusal("writable", f"{what} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o})")
    return None


def _same_socket(endpoint: str, own: str) -> bool:
    if os.path.realpath(endpoint) == os.path.realpath(own):
        return True
    try:
        a, b = os.stat(endpoint), os.stat(own)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@dataclass
class _FileState:
    signature: _Signature
    registration: Registration | None
    error: str = ""


@dataclass
class _Channel:
    channel: grpc.aio.Channel
    stub: Any  # Any: the generated gRPC stub (``hookserver_pb2_grpc`` has no type stubs)
    users: set[str] = field(default_factory=set)


class HookServerRegistry:
    """Keeps ``pipeline``'s remote steps in line with the registration directory."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        pipeline: Pipeline,
        *,
        default_timeout: float = 2.0,
        poll_interval: float = POLL_INTERVAL,
        own_sockets: Iterable[str] = (),
    ) -> None:
        """``own_sockets``: the proxy's backend and listen sockets; a registration naming one
        of them is refused."""
        self.directory = Path(directory)
        self.pipeline = pipeline
        self.default_timeout = default_timeout
        self.poll_interval = poll_interval
        self.own_sockets = tuple(strip_unix(p) for p in own_sockets if p)
        self._dir_refusal: _Refusal | None = None
        self._files: dict[str, _FileState] = {}
        self._channels: dict[str, _Channel] = {}
        self._steps: list[RemoteStep] = []
        self._poller = Background()
        self._closing: dict[asyncio.Task[None], grpc.aio.Channel] = {}
        self._dir_missing_logged = False
        # Bumped whenever the set of steps changes (tests wait on it).
        self.generation = 0

    # -- reading ----------------------------------------------------------------------------------

    @property
    def steps(self) -> list[RemoteStep]:
        """The current steps, in calling (file-name) order."""
        return list(self._steps)

    @property
    def errors(self) -> dict[str, str]:
        """Registration files skipped as malformed, with the reason."""
        return {name: st.error for name, st in self._files.items() if st.error}

    def endpoints(self) -> list[str]:
        """Endpoints with an open channel."""
        return sorted(self._channels)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Read the directory once (so the proxy starts with its registrations), then poll."""
        await self.refresh()
        self._poller.start(
            every(self.poll_interval, self.refresh, logger=log, error="reading hook-server registrations failed",
                  delay_first=True),
            name="hookserver-registry",
        )

    async def stop(self) -> None:
        await self._poller.stop()
        self.pipeline.set_remote_steps([])
        self._steps = []
        closing = [*self._closing.items()]
        self._closing.clear()
        for task, channel in closing:
            task.cancel()
            await channel.close()
        for ch in self._channels.values():
            await ch.channel.close()
        self._channels.clear()

    # -- scanning ---------------------------------------------------------------------------------

    async def refresh(self) -> bool:
        """Re-read changed files and update the pipeline. True when the steps changed."""
        found = await asyncio.to_thread(self._scan, {n: st.signature for n, st in self._files.items()})
        changed = False
        for name in list(self._files):
            if name not in found:
                gone = self._files.pop(name)
                log.info("hook-server registration removed", file=name)
                changed = changed or gone.registration is not None
        for name, (signature, text) in found.items():
            if text is None:
                continue  # unchanged since last read
            if isinstance(text, _Refusal):
                state = self._refuse(name, signature, text)
            else:
                state = self._parse(name, signature, text)
            previous = self._files.get(name)
            self._files[name] = state
            if previous is None or previous.registration != state.registration:
                changed = True
        if changed:
            self._rebuild()
        return changed

    def _scan(self, known: Mapping[str, _Signature]) -> dict[str, tuple[_Signature, bytes | _Refusal | None]]:
        """``{file name: (signature, content, a refusal, or None when unchanged)}`` for the
        ``*.json`` files. Runs in a worker thread; touches only ``_dir_missing_logged`` and
        ``_dir_refusal`` of the registry."""
        out: dict[str, tuple[_Signature, bytes | _Refusal | None]] = {}
        entries: list[os.DirEntry[str]] = []
        try:
            dir_st = os.lstat(self.directory)
            if not stat.S_ISLNK(dir_st.st_mode):
                entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            if not self._dir_missing_logged:
                log.info("hook-server registration directory does not exist (yet)", dir=str(self.directory))
                self._dir_missing_logged = True
            return out
        except NotADirectoryError:
            log.warning("hook-server registration path is not a directory", dir=str(self.directory))
            return out
        self._dir_missing_logged = False
        refusal = _unsafe(dir_st, "the registration directory")
        if refusal is not None:
            refusal = _Refusal("unsafe-directory", refusal.message)
        if refusal != self._dir_refusal:
            self._dir_refusal = refusal
            if refusal is not None:
                log.warning("hook-server registrations refused: unsafe directory", dir=str(self.directory),
                            reason=refusal.message)
                metrics.REGISTRATIONS_REFUSED.labels(refusal.reason).inc()
            else:
                log.info("hook-server registration directory is safe again", dir=str(self.directory))
        if refusal is not None:
            return out
        for entry in entries:
            if not entry.name.endswith(".json"):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                signature = _signature(st)
                if known.get(entry.name) == signature:
                    out[entry.name] = (signature, None)
                    continue
                out[entry.name] = (signature, self._read(entry.path, st))
            except OSError as exc:  # removed between listing and reading, or unreadable
                if entry.name in known:
                    out[entry.name] = (known[entry.name], None)
                log.debug("registration file not readable now", file=entry.name, error=str(exc))
        return out

    @staticmethod
    def _read(path: str, st: os.stat_result) -> bytes | _Refusal:
        """The content of a trusted registration file, or why it is not read (through
        ``rhp_ops.files.read_regular_file``: no symlink followed, the file ``st`` describes)."""
        if not stat.S_ISLNK(st.st_mode) and not stat.S_ISREG(st.st_mode):
            return _Refusal("not-regular-file", "not a regular file")
        refusal = _unsafe(st, "the file")
        if refusal is not None:
            return refusal
        try:
            return read_regular_file(path, limit=MAX_REGISTRATION_BYTES, follow_symlinks=False, expect=st)
        except FileRefused as exc:
            if exc.reason in ("missing", "replaced"):  # changed since the listing: read again next round
                raise FileNotFoundError(f"{path}: {exc.message}") from None
            if exc.reason == "unreadable":
                raise OSError(f"{path}: {exc.message}") from None
            return _Refusal(exc.reason, exc.message)

    def _refuse(self, name: str, signature: _Signature, refusal: _Refusal) -> _FileState:
        log.warning("hook-server registration refused", file=name, dir=str(self.directory), reason=refusal.reason,
                    error=refusal.message)
        metrics.REGISTRATIONS_REFUSED.labels(refusal.reason).inc()
        return _FileState(signature, None, refusal.message)

    def _parse(self, name: str, signature: _Signature, text: bytes) -> _FileState:
        try:
            reg = parse_registration(name, text, self.default_timeout)
        except RegistrationError as exc:
            log.warning("malformed hook-server registration skipped", file=name, dir=str(self.directory),
                        error=str(exc))
            metrics.REGISTRATIONS_REFUSED.labels("malformed").inc()
            return _FileState(signature, None, str(exc))
        own = next((p for p in self.own_sockets if _same_socket(reg.endpoint, p)), None)
        if own is not None:
            return self._refuse(name, signature, _Refusal(
                "own-socket", f"remote-endpoint {reg.endpoint} is the proxy's own socket {own}"))
        if reg.ignored_hooks:
            log.warning("unknown hook names in registration left out", file=name, hooks=list(reg.ignored_hooks))
        if not reg.hooks:
            log.warning("registration names no hook point we dispatch", file=name)
        log.info("hook-server registration loaded", file=name, endpoint=reg.endpoint, policy=reg.policy,
                 hooks=list(reg.hooks), timeout=reg.timeout)
        return _FileState(signature, reg)

    def _rebuild(self) -> None:
        # gRPC is imported once a hook server is registered, not with the module: a node without
        # hook servers (and the NRI plugin) never loads the library, about 10 MiB of its memory.
        import grpc

        from cri_protos import hookserver_pb2_grpc

        regs = [st.registration for _, st in sorted(self._files.items()) if st.registration is not None]
        wanted = {r.endpoint for r in regs}
        for endpoint in [e for e in self._channels if e not in wanted]:
            self._retire(endpoint)
        steps: list[RemoteStep] = []
        for reg in regs:
            ch = self._channels.get(reg.endpoint)
            if ch is None:
                channel = grpc.aio.insecure_channel(f"unix://{reg.endpoint}", options=_CHANNEL_OPTIONS)
                ch = _Channel(channel, hookserver_pb2_grpc.RuntimeHookServiceStub(channel))
                self._channels[reg.endpoint] = ch
            ch.users = {r.name for r in regs if r.endpoint == reg.endpoint}
            steps.append(RemoteStep(reg, ch.stub))
        self._steps = steps
        self.pipeline.set_remote_steps(steps)
        self.generation += 1
        log.info("hook servers in use", order=[s.registration.name for s in steps])

    def _retire(self, endpoint: str) -> None:
        ch = self._channels.pop(endpoint)
        delay = max([self.default_timeout, *(s.timeout for s in self._steps)]) + 0.5

        async def close_later() -> None:
            await asyncio.sleep(delay)
            await ch.channel.close()
            log.info("hook-server channel closed", endpoint=endpoint)

        task = asyncio.create_task(close_later())
        self._closing[task] = ch.channel
        task.add_done_callback(lambda t: self._closing.pop(t, None))

