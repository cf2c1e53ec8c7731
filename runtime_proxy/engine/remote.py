"""Out-of-process hook servers: Koordinator's ``runtime.v1alpha1.RuntimeHookService``, proxy side.

Started by ``serve`` and ``nri`` (``runtime_proxy/commands/``); it hands the pipeline
(``runtime_proxy.engine.pipeline.Pipeline.set_remote_steps``) one ``RemoteStep`` per registered
hook server, so hook servers run after the in-process plugins under the same policy model
(Fail/Ignore, timeouts, conflicts). ``runtime_proxy.hookserver.door`` (the server side) reuses
the pure facts <-> protocol conversions of this module.

Registrations. Every ``*.json`` file in the registration directory (``hookServerDir``, default
``/etc/runtime/hookserver.d``) registers one server, with Koordinator's keys::

    {"remote-endpoint": "/var/run/koordlet/koordlet.sock",
     "failure-policy": "Ignore",
     "runtime-hooks": ["PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"],
     "timeout-seconds": 1.5}

- ``remote-endpoint``: an absolute unix socket path; ``unix://`` in front is accepted.
- ``failure-policy``: ``Fail``, ``Ignore``, ``None`` or empty (the last three all mean Ignore).
- ``runtime-hooks``: Koordinator hook point names; unknown names are logged and left out.
- ``timeout-seconds`` (our extension, optional): per-call timeout; default ``hookServerTimeout``.
  Koordinator has no timeout of its own (a hung server stalls kubelet's call).
- Any other key makes the file malformed (``RegistrationDocument``), with the key named.

The directory is polled every 0.5 s (a stat of each file; a file is re-read only when its
mtime, size or inode changed), so a file added, changed or removed takes effect within about a
second, with no restart. Polling instead of inotify is deliberate: it works on any filesystem,
survives the directory being deleted and re-created, and has no missed-event corner cases. A
missing directory is treated as empty until it appears. A malformed file is logged (once per
version of the file) and skipped; the other registrations are not disturbed.

Trust. A registration decides which socket the proxy sends every pod's data to, and with
``Fail`` it can block every pod, so only files that root (or the proxy's own user) controls are
read: the directory and each file must be owned by root or by the proxy's effective user and
must not be group- or world-writable; the directory itself and any file in it must not be a
symlink; a file is at most ``MAX_REGISTRATION_BYTES``. A registration whose endpoint is one of
the proxy's own sockets (its backend, containerd's, or its listen socket; compared by resolved
path and by inode) is refused. Every refusal is logged with its reason (once per version of the
file) and counted in ``rhp_hookserver_registrations_refused_total{reason}``; an unsafe directory
drops every registration until it is fixed.

Order. Koordinator calls only the first server that registered a hook point. We call every
server that registered it, in file-name order (byte order of the names, so ``10-a.json`` runs
before ``20-b.json``); each sees the request as changed by the in-process plugins and by the
servers before it.

Merge rules (Koordinator's ``UpdateRequest``/``updateResource``), turned into a ``Plan`` that
holds only what actually changes relative to the request the server saw, so the pipeline's
conflict rules apply (a server that sets a field an earlier step set to another value is a
conflict, decided by its policy):

- ``PreRunPodSandbox``: labels and annotations are overlaid (keys added or changed);
  a non-empty ``cgroup_parent`` replaces the sandbox's; ``resources`` is ignored (as in
  Koordinator's containerd mode).
- ``PreCreateContainer``: container annotations overlaid; ``container_resources`` (when the
  response carries it) by field: ``cpu_period``, ``cpu_shares``, ``memory_limit_in_bytes``,
  ``memory_swap_limit_in_bytes`` only when > 0; ``cpu_quota`` when != 0 (-1 allowed);
  ``oom_score_adj`` when in [-1000, 1000] (so 0 overwrites); ``cpuset_cpus`` and
  ``cpuset_mems`` always, even when empty (an empty cpuset clears the request's: a server must
  echo the resources it received); ``unified`` overlaid; hugepage limits ignored. A non-empty
  ``pod_cgroup_parent`` replaces the sandbox cgroup parent. A non-empty ``container_envs`` map
  replaces the environment in Koordinator; we set the keys it adds or changes and keep the
  others (a plan cannot delete a variable; keys left out are logged).
- ``PreUpdateContainerResources``: resources only, by the same field rules.
- ``PreStartContainer`` and every ``Post*`` hook: the response is ignored; only a failure
  counts (and post hooks never fail a call).

Pods labelled ``runtimeproxy.koordinator.sh/skip-hookserver=true`` are never sent (the
interceptor skips all hooks for them; ``RemoteStep`` checks again).

Channels. One ``grpc.aio`` channel per endpoint, shared by every registration naming it, closed
(after the longest timeout, so calls in flight finish) when no registration names it any more.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from cri_protos import hookserver_pb2
from hooks.facts import ContainerFacts, NodeFacts, PodFacts, Resources, frozen_map
from hooks.plan import Plan, ResourceChanges
from hooks.spec import KOORD_HOOK_POINTS
from koord_formats.bounded import load_json
from koord_formats.errors import FormatError
from rhp_ops.files import FileRefused, read_regular_file
from runtime_proxy import metrics
from runtime_proxy.config import validation_message
from runtime_proxy.engine.background import Background, every
from runtime_proxy.engine.pipeline import Pipeline, StepError
from runtime_proxy.state.store import fill_resources_pb, resources_from_pb

if TYPE_CHECKING:
    import grpc

log = structlog.get_logger(__name__)

__all__ = [
    "MAX_REGISTRATION_BYTES",
    "POD_HOOKS",
    "HookServerRegistry",
    "Registration",
    "RegistrationDocument",
    "RegistrationError",
    "RemoteStep",
    "container_facts_from_request",
    "container_plan_from_response",
    "container_request",
    "container_response",
    "merge_resources",
    "parse_registration",
    "pod_facts_from_request",
    "pod_plan_from_response",
    "pod_request",
    "pod_response",
    "strip_unix",
]

Policy = Literal["Fail", "Ignore"]

POLL_INTERVAL = 0.5
MAX_REGISTRATION_BYTES = 64 << 10
MAX_TIMEOUT = 300.0
POD_HOOKS = frozenset({"PreRunPodSandbox", "PostStopPodSandbox"})
# Hook points whose response may change the CRI request (the others only report failures).
_MERGED_HOOKS = frozenset({"PreRunPodSandbox", "PreCreateContainer", "PreUpdateContainerResources"})
_POLICIES: dict[str, Policy] = {"Fail": "Fail", "Ignore": "Ignore", "None": "Ignore", "": "Ignore"}
_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]


# ---- registrations ------------------------------------------------------------------------------


class RegistrationError(ValueError):
    """A registration file that cannot be used; the message says why."""


@dataclass(frozen=True)
class Registration:
    """One hook server, as a registration file describes it."""

    name: str  # the file name, e.g. "koordlet.json"
    endpoint: str  # unix socket path, no scheme
    policy: Policy
    hooks: tuple[str, ...]  # Koordinator hook point names, in the file's order
    timeout: float
    ignored_hooks: tuple[str, ...] = ()


def strip_unix(endpoint: str) -> str:
    """``unix:///run/x.sock`` and ``/run/x.sock`` -> ``/run/x.sock``."""
    return endpoint[len("unix://"):] if endpoint.startswith("unix://") else endpoint


class RegistrationDocument(BaseModel):
    """A registration file's shape: Koordinator's three keys and our ``timeout-seconds``; any
    other key is an error naming it. Values are checked further by ``parse_registration``."""

    model_config = ConfigDict(extra="forbid")

    remote_endpoint: StrictStr = Field(alias="remote-endpoint")
    failure_policy: StrictStr | None = Field(default=None, alias="failure-policy")
    runtime_hooks: list[StrictStr] = Field(alias="runtime-hooks")
    timeout_seconds: StrictFloat | StrictInt | None = Field(default=None, alias="timeout-seconds")


def parse_registration(name: str, text: str | bytes, default_timeout: float) -> Registration:
    """Parse one registration file's content: bounded (``MAX_REGISTRATION_BYTES``) before the
    JSON load, then ``RegistrationDocument``'s shape, then the values. Raises
    ``RegistrationError`` when malformed."""
    if len(text) > MAX_REGISTRATION_BYTES:
        raise RegistrationError(f"larger than {MAX_REGISTRATION_BYTES} bytes")
    try:
        raw = text.decode("utf-8") if isinstance(text, bytes) else text
        data = load_json(raw, "registration", max_chars=MAX_REGISTRATION_BYTES)
    except UnicodeDecodeError as exc:
        raise RegistrationError(f"not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except FormatError as exc:
        raise RegistrationError(str(exc).removeprefix("registration: ")) from exc
    if not isinstance(data, dict):
        raise RegistrationError("must be a JSON object")
    try:
        doc = RegistrationDocument.model_validate(data)
    except ValidationError as exc:
        raise RegistrationError(validation_message(exc, RegistrationDocument)) from exc
    raw_endpoint = doc.remote_endpoint
    if not raw_endpoint.strip():
        raise RegistrationError("remote-endpoint must be a non-empty string")
    endpoint = strip_unix(raw_endpoint.strip())
    if "://" in endpoint:
        raise RegistrationError(f"remote-endpoint {raw_endpoint!r}: only unix sockets are supported")
    if not endpoint.startswith("/") or "\x00" in endpoint:
        raise RegistrationError(f"remote-endpoint {raw_endpoint!r} must be an absolute socket path")
    raw_policy = doc.failure_policy or ""
    if raw_policy not in _POLICIES:
        raise RegistrationError(f"failure-policy {raw_policy!r} must be Fail, Ignore, None or empty")
    hooks: list[str] = []
    ignored: list[str] = []
    for hook in doc.runtime_hooks:
        if hook in KOORD_HOOK_POINTS:
            if hook not in hooks:
                hooks.append(hook)
        else:
            ignored.append(hook)
    timeout = default_timeout
    if doc.timeout_seconds is not None:
        if not 0 < doc.timeout_seconds <= MAX_TIMEOUT:
            raise RegistrationError(f"timeout-seconds must be in (0, {MAX_TIMEOUT:g}]")
        timeout = float(doc.timeout_seconds)
    return Registration(name, endpoint, _POLICIES[raw_policy], tuple(hooks), timeout, tuple(ignored))


# ---- facts <-> protocol (pure; shared with runtime_proxy.hookserver.door) ------------------------------
# Container resources are read and written by runtime_proxy.state.store's functions, which
# serve the CRI's message and the hook server protocol's alike.


def _pod_meta(pod: PodFacts) -> hookserver_pb2.PodSandboxMetadata:
    return hookserver_pb2.PodSandboxMetadata(name=pod.name, uid=pod.uid, namespace=pod.namespace, attempt=pod.attempt)


def pod_request(pod: PodFacts) -> hookserver_pb2.PodSandboxHookRequest:
    """A ``PodSandboxHookRequest`` as Koordinator's containerd mode fills it (no resources)."""
    return hookserver_pb2.PodSandboxHookRequest(
        pod_meta=_pod_meta(pod),
        runtime_handler=pod.runtime_handler,
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
        cgroup_parent=pod.cgroup_parent,
    )


def container_request(pod: PodFacts, container: ContainerFacts) -> hookserver_pb2.ContainerResourceHookRequest:
    """A ``ContainerResourceHookRequest`` (pod resources are unknown in CRI mode: left empty)."""
    req = hookserver_pb2.ContainerResourceHookRequest(
        pod_meta=_pod_meta(pod),
        container_meta=hookserver_pb2.ContainerMetadata(
            name=container.name, attempt=container.attempt, id=container.id
        ),
        container_annotations=dict(container.annotations),
        pod_annotations=dict(pod.annotations),
        pod_labels=dict(pod.labels),
        pod_cgroup_parent=pod.cgroup_parent,
        container_envs=dict(container.envs),
    )
    fill_resources_pb(req.container_resources, container.resources)
    return req


def pod_facts_from_request(
    req: hookserver_pb2.PodSandboxHookRequest | hookserver_pb2.ContainerResourceHookRequest,
) -> PodFacts:
    """``PodFacts`` from a ``PodSandboxHookRequest`` or a ``ContainerResourceHookRequest``
    (the sandbox id is not part of the protocol and stays empty)."""
    md = req.pod_meta
    if isinstance(req, hookserver_pb2.PodSandboxHookRequest):
        labels, annotations, cgroup_parent = req.labels, req.annotations, req.cgroup_parent
        handler = req.runtime_handler
    else:
        labels, annotations, cgroup_parent = req.pod_labels, req.pod_annotations, req.pod_cgroup_parent
        handler = ""
    return PodFacts(
        name=md.name,
        namespace=md.namespace,
        uid=md.uid,
        attempt=md.attempt,
        labels=frozen_map(dict(labels)),
        annotations=frozen_map(dict(annotations)),
        cgroup_parent=cgroup_parent,
        runtime_handler=handler,
    )


def container_facts_from_request(req: hookserver_pb2.ContainerResourceHookRequest) -> ContainerFacts:
    md = req.container_meta
    return ContainerFacts(
        name=md.name,
        id=md.id,
        attempt=md.attempt,
        annotations=frozen_map(dict(req.container_annotations)),
        resources=resources_from_pb(req.container_resources),
        envs=frozen_map(dict(req.container_envs)),
    )


def pod_response(pod: PodFacts, plan: Plan) -> hookserver_pb2.PodSandboxHookResponse:
    """The server's answer for a pod hook: the full (changed) labels and annotations, and the
    cgroup parent when the plan changes it."""
    return hookserver_pb2.PodSandboxHookResponse(
        labels=dict(pod.labels),
        annotations=dict(pod.annotations),
        cgroup_parent=plan.cgroup_parent or "",
    )


def container_response(
    pod: PodFacts, container: ContainerFacts, plan: Plan
) -> hookserver_pb2.ContainerResourceHookResponse:
    """The server's answer for a container hook. Echoes the full resources (Koordinator copies
    the cpuset even when empty, so a partial answer would clear it) and annotations; envs only
    when the plan sets some (a non-empty map replaces the environment)."""
    resp = hookserver_pb2.ContainerResourceHookResponse(
        container_annotations=dict(container.annotations),
        pod_cgroup_parent=plan.cgroup_parent or "",
    )
    fill_resources_pb(resp.container_resources, container.resources)
    if plan.envs:
        resp.container_envs.update(dict(container.envs))
    return resp


def _overlay(seen: Mapping[str, str], answer: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in answer.items() if seen.get(k) != v}


def merge_resources(seen: Resources, answer: hookserver_pb2.LinuxContainerResources) -> ResourceChanges:
    """Koordinator's ``updateResource`` as a set of changes: the fields of ``seen`` that the
    answer (a ``runtime.v1alpha1.LinuxContainerResources``) changes, with their new values."""
    new: dict[str, int | str | Mapping[str, str]] = {}
    for name in ("cpu_period", "cpu_shares", "memory_limit_in_bytes", "memory_swap_limit_in_bytes"):
        value = getattr(answer, name)
        if value > 0:
            new[name] = value
    if answer.cpu_quota != 0:
        new["cpu_quota"] = answer.cpu_quota
    if -1000 <= answer.oom_score_adj <= 1000:
        new["oom_score_adj"] = answer.oom_score_adj
    new["cpuset_cpus"] = answer.cpuset_cpus
    new["cpuset_mems"] = answer.cpuset_mems
    changes = {k: v for k, v in new.items() if getattr(seen, k) != v}
    if answer.unified:
        unified = {**seen.unified, **dict(answer.unified)}
        if unified != dict(seen.unified):
            changes["unified"] = unified
    return ResourceChanges.parse(changes)


def pod_plan_from_response(pod: PodFacts, resp: hookserver_pb2.PodSandboxHookResponse) -> Plan:
    """What a ``PodSandboxHookResponse`` changes relative to the pod the server saw."""
    plan = Plan()
    plan.labels.update(_overlay(pod.labels, resp.labels))
    plan.annotations.update(_overlay(pod.annotations, resp.annotations))
    if resp.cgroup_parent and resp.cgroup_parent != pod.cgroup_parent:
        plan.set_cgroup_parent(resp.cgroup_parent)
    return plan


def container_plan_from_response(
    stage: str,
    pod: PodFacts,
    container: ContainerFacts,
    resp: hookserver_pb2.ContainerResourceHookResponse,
    *,
    server: str = "",
) -> Plan:
    """What a ``ContainerResourceHookResponse`` changes relative to the request the server saw.
    ``PreUpdateContainerResources`` takes resources only; ``PreCreateContainer`` everything."""
    plan = Plan()
    if resp.HasField("container_resources"):
        plan.resources = merge_resources(container.resources, resp.container_resources)
    if stage != "PreCreateContainer":
        return plan
    plan.annotations.update(_overlay(container.annotations, resp.container_annotations))
    if resp.pod_cgroup_parent and resp.pod_cgroup_parent != pod.cgroup_parent:
        plan.set_cgroup_parent(resp.pod_cgroup_parent)
    if resp.container_envs:
        plan.envs.update(_overlay(container.envs, resp.container_envs))
        dropped = sorted(set(container.envs) - set(resp.container_envs))
        if dropped:
            log.info("hook server left env keys out of its answer; they are kept", server=server, keys=dropped)
    return plan


# ---- the pipeline step --------------------------------------------------------------------------


class RemoteStep:
    """One registered hook server as a pipeline step (``runtime_proxy.engine.pipeline.Step``)."""

    def __init__(self, registration: Registration, stub: Any) -> None:  # Any: untyped generated gRPC stub
        self.registration = registration
        self.name = f"hookserver:{registration.name}"
        self.policy: Policy = registration.policy
        # The gRPC deadline is the real timeout; the pipeline's wait_for is a backstop.
        self.timeout = registration.timeout + 0.5
        self._stub = stub
        self._hooks = frozenset(registration.hooks)

    def handles(self, stage: str) -> bool:
        return stage in self._hooks

    async def call(
        self,
        stage: str,
        pod: PodFacts,
        container: ContainerFacts | None,
        node: NodeFacts,
        extra: Mapping[str, object] | None = None,
    ) -> Plan | None:
        if pod.skips_hooks:
            return None
        reg = self.registration
        request: hookserver_pb2.PodSandboxHookRequest | hookserver_pb2.ContainerResourceHookRequest
        if stage in POD_HOOKS:
            request = pod_request(pod)
        elif container is not None:
            request = container_request(pod, container)
        else:
            return None
        import grpc  # loaded by the registry with the first channel (see ``_rebuild``)

        method = getattr(self._stub, f"{stage}Hook")
        try:
            resp = await method(request, timeout=reg.timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                metrics.PLUGIN_TIMEOUTS.labels(self.name, stage).inc()
                raise StepError(
                    "timeout", f"hook server {reg.endpoint} gave no answer within {reg.timeout:g}s"
                ) from exc
            raise StepError("error", f"hook server {reg.endpoint}: {code.name}: {exc.details()}") from exc
        if stage not in _MERGED_HOOKS:
            return None
        if stage in POD_HOOKS:
            return pod_plan_from_response(pod, resp)
        assert container is not None
        return container_plan_from_response(stage, pod, container, resp, server=self.name)


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

