"""CPUs bound to pods, read from each pod's resource-status annotation once per annotation value.

Used by ``runtime_proxy.engine.lifecycle`` (the node facts every hook sees: ``bound_cpusets`` and
``lse_pods``, the input of the CPU share pools) and by ``runtime_proxy.loops.reconciler``.

A pod's annotations are input from whoever created the pod, so each pod is handled on its own:
an annotation that does not parse (malformed, too deep, too large, an overflowing quantity) or
that takes longer than the deadline to parse leaves only that pod out of the bound cpusets. It is
logged once per annotation value and counted in ``rhp_pod_input_rejected_total``; every other pod
goes on. The result of each parse is kept until the pod's annotation changes or the pod leaves,
so a poisoned pod costs one parse, not one per call.

A cpuset that parses is bound only under the node's trust rules (``hooks.facts``, section
"which resource-status cpusets the node trusts"): the claim is proven (with the node agent's
public keys: its allocation signature verifies and it is within the request it states), the
pod's class may hold one, its CPUs are the node's, and no older pod (earlier in the list the
caller passes, the store's order) holds them.
A refused cpuset is logged with the pod's identity and counted in
``rhp_untrusted_allocations_total`` once per pod and reason; the pod's CPUs stay in the pools.

``refresh`` parses the values not seen before in a worker thread under a deadline, so no pod's
annotation holds the event loop; ``bound`` only reads what is known (and parses inline what was
never refreshed, for callers that already run off the event loop).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog
from prometheus_client import Counter

from hooks.facts import NodeFacts, PodFacts, node_cpus, resolve_cpuset_claims
from koord_formats import keys
from koord_formats.errors import FormatError
from koord_formats.pod import parse_resource_status

__all__ = ["PARSE_DEADLINE", "POD_INPUT_REJECTED", "UNTRUSTED_ALLOCATIONS", "BoundCpusets", "untrusted_kind"]

log = structlog.get_logger(__name__)

POD_INPUT_REJECTED = Counter(
    "rhp_pod_input_rejected",
    "Pod annotation values that could not be used (counted once per value), by reader and kind.",
    ["where", "kind"],
)

UNTRUSTED_ALLOCATIONS = Counter(
    "rhp_untrusted_allocations",
    "Scheduler-owned pod allocations the node ignored (counted once per pod and reason), by "
    "annotation and reason (qos-class, off-node, signature, over-request, held).",
    ["annotation", "reason"],
)

# Seconds a pod's resource-status may take to parse before the pod counts as poisoned.
PARSE_DEADLINE = 1.0


@dataclass(frozen=True)
class _Entry:
    """What one annotation value of one pod gave."""

    raw: str
    cpus: frozenset[int]
    # Why the value was not used ("" when it was).
    rejected: str = ""


def _parse(raw: str) -> _Entry:
    """Parse one resource-status value; any failure is this pod's alone."""
    try:
        status = parse_resource_status(raw)
    except FormatError as exc:
        return _Entry(raw, frozenset(), f"malformed: {exc}")
    except Exception as exc:  # the last line: whatever a hostile value provokes stays with its pod
        return _Entry(raw, frozenset(), f"{type(exc).__name__}: {exc}")
    return _Entry(raw, status.cpuset)


def _kind(reason: str) -> str:
    return reason.split(":", 1)[0]


class BoundCpusets:
    """Per-pod parse cache of resource-status cpusets (see the module docstring).

    :param where: the reader's name in logs and metrics (``interceptor``, ``reconciler``).
    :param deadline: seconds ``refresh`` waits for one pod's parse.
    """

    def __init__(self, *, where: str, deadline: float = PARSE_DEADLINE) -> None:
        self.where = where
        self.deadline = deadline
        # pod uid -> the parse of its current annotation value
        self._entries: dict[str, _Entry] = {}
        # pod uid -> (value, parse in a worker thread) while one runs
        self._running: dict[str, tuple[str, asyncio.Future[_Entry]]] = {}
        # pod uid -> why its cpuset was last refused (logged once per reason)
        self._refused: dict[str, str] = {}

    def _known(self, uid: str, raw: str) -> _Entry | None:
        entry = self._entries.get(uid)
        if entry is not None and (entry.raw is raw or entry.raw == raw):
            return entry
        return None

    def _keep(self, uid: str, entry: _Entry) -> _Entry:
        self._entries[uid] = entry
        if entry.rejected:
            POD_INPUT_REJECTED.labels(self.where, _kind(entry.rejected)).inc()
            log.warning(
                "pod resource-status not usable; the pod is left out of the bound cpusets",
                where=self.where,
                pod_uid=uid,
                reason=entry.rejected[:200],
                size=len(entry.raw),
            )
        return entry

    @staticmethod
    def _inputs(pods: Iterable[PodFacts]) -> Iterable[tuple[PodFacts, str]]:
        for pod in pods:
            raw = pod.annotations.get(keys.ANNOTATION_RESOURCE_STATUS)
            if raw and pod.uid:
                yield pod, raw

    async def refresh(self, pods: Iterable[PodFacts]) -> None:
        """Parse the annotation values not seen before, each in a worker thread for at most
        ``deadline`` seconds; a parse that runs longer rejects its pod (its thread is left to
        finish, and its result is not used)."""
        loop = asyncio.get_running_loop()
        for pod, raw in self._inputs(pods):
            if self._known(pod.uid, raw) is not None:
                continue
            running = self._running.get(pod.uid)
            if running is None or running[0] != raw:
                future = loop.run_in_executor(None, _parse, raw)
                running = (raw, future)
                self._running[pod.uid] = running
                future.add_done_callback(functools.partial(self._done, pod.uid, running))
            # asyncio.wait, not asyncio.timeout: the relay runs hooks up to their first wait
            # outside any task, and asyncio.wait neither needs one nor cancels the parse.
            done, _ = await asyncio.wait({running[1]}, timeout=self.deadline)
            if done:
                entry = running[1].result()
            else:
                entry = _Entry(raw, frozenset(), f"timeout: not parsed within {self.deadline:g}s")
            if self._known(pod.uid, raw) is None:
                self._keep(pod.uid, entry)

    def _done(self, uid: str, mine: tuple[str, asyncio.Future[_Entry]], _future: object) -> None:
        if self._running.get(uid) is mine:
            del self._running[uid]

    def rejected(self, pod: PodFacts) -> str:
        """Why ``pod``'s resource-status was not used ("" when it was, or was never read)."""
        raw = pod.annotations.get(keys.ANNOTATION_RESOURCE_STATUS)
        entry = self._known(pod.uid, raw) if raw else None
        return entry.rejected if entry is not None else ""

    def bound(
        self, pods: Iterable[PodFacts], node: NodeFacts | None = None
    ) -> tuple[Mapping[str, frozenset[int]], frozenset[str]]:
        """CPUs bound to each pod (by uid) and the uids of the LSE pods among them, under the
        node's trust rules (``hooks.facts.resolve_cpuset_claims``; ``pods`` oldest first, the
        CPUs of ``node`` when given). A refused claim is logged and counted in
        ``rhp_untrusted_allocations_total`` once per pod and reason."""
        claims: list[tuple[PodFacts, frozenset[int]]] = []
        seen: set[str] = set()
        for pod, raw in self._inputs(pods):
            seen.add(pod.uid)
            entry = self._known(pod.uid, raw) or self._keep(pod.uid, _parse(raw))
            if entry.cpus:
                claims.append((pod, entry.cpus))
        if node is None:
            resolved = resolve_cpuset_claims(claims, None)
        else:
            resolved = resolve_cpuset_claims(claims, node_cpus(node), keys_=node.allocation_keys, node_name=node.name)
        if resolved.refused:
            by_uid = {p.uid: p for p, _ in claims}
            for uid, reason in resolved.refused.items():
                if self._refused.get(uid) != reason:
                    self._refused[uid] = reason
                    _untrusted(self.where, by_uid[uid], reason)
        if len(self._entries) > 2 * len(seen) + 64:
            self._entries = {uid: e for uid, e in self._entries.items() if uid in seen}
        if len(self._refused) > 2 * len(seen) + 64:
            self._refused = {uid: r for uid, r in self._refused.items() if uid in seen}
        return resolved.bound, resolved.lse

    def with_bound_pods(self, node: NodeFacts, pods: Iterable[PodFacts]) -> NodeFacts:
        """``node`` with ``bound_cpusets`` and ``lse_pods`` taken from ``pods`` (oldest first)."""
        bound, lse = self.bound(pods, node)
        return node.replace(bound_cpusets=bound, lse_pods=lse)


def untrusted_kind(reason: str) -> str:
    """The ``reason`` label of ``rhp_untrusted_allocations_total`` for a refusal."""
    if reason.startswith("QoS class"):
        return "qos-class"
    if "not on this node" in reason:
        return "off-node"
    if reason.startswith("not signed"):
        return "signature"
    if "more than the pod's CPU request" in reason:
        return "over-request"
    return "held"


def _untrusted(where: str, pod: PodFacts, reason: str) -> None:
    UNTRUSTED_ALLOCATIONS.labels("resource-status", untrusted_kind(reason)).inc()
    log.warning(
        "pod resource-status cpuset not trusted; the pod runs as if it had none",
        where=where,
        pod=f"{pod.namespace}/{pod.name}",
        pod_uid=pod.uid,
        qos=pod.qos_label or "none",
        reason=reason[:200],
    )
