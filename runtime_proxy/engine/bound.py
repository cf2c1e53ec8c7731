"""CPUs bound to pods, read from each pod's resource-status annotation once per annotation value.

Used by ``runtime_proxy.engine.intercept`` (the node facts every hook sees: ``bound_cpusets`` and
``lse_pods``, the input of the CPU share pools) and by ``runtime_proxy.loops.reconciler``.

A pod's annotations are input from whoever created the pod, so each pod is handled on its own:
an annotation that does not parse (malformed, too deep, too large, an overflowing quantity) or
that takes longer than the deadline to parse leaves only that pod out of the bound cpusets. It is
logged once per annotation value and counted in ``rhp_pod_input_rejected_total``; every other pod
goes on. The result of each parse is kept until the pod's annotation changes or the pod leaves,
so a poisoned pod costs one parse, not one per call.

``refresh`` parses the values not seen before in a worker thread under a deadline, so no pod's
annotation holds the event loop; ``bound`` only reads what is known (and parses inline what was
never refreshed, for callers that already run off the event loop).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import structlog
from prometheus_client import Counter

from hooks.facts import NodeFacts, PodFacts
from koord_formats import keys
from koord_formats.errors import FormatError
from koord_formats.pod import parse_resource_status

__all__ = ["PARSE_DEADLINE", "POD_INPUT_REJECTED", "BoundCpusets"]

log = structlog.get_logger(__name__)

POD_INPUT_REJECTED = Counter(
    "rhp_pod_input_rejected",
    "Pod annotation values that could not be used (counted once per value), by reader and kind.",
    ["where", "kind"],
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

    def bound(self, pods: Iterable[PodFacts]) -> tuple[Mapping[str, frozenset[int]], frozenset[str]]:
        """CPUs bound to each pod (by uid) and the uids of the LSE pods among them."""
        bound: dict[str, frozenset[int]] = {}
        lse: set[str] = set()
        seen: set[str] = set()
        for pod, raw in self._inputs(pods):
            seen.add(pod.uid)
            entry = self._known(pod.uid, raw) or self._keep(pod.uid, _parse(raw))
            if entry.cpus:
                bound[pod.uid] = entry.cpus
                if pod.qos_label == "LSE":
                    lse.add(pod.uid)
        if len(self._entries) > 2 * len(seen) + 64:
            self._entries = {uid: e for uid, e in self._entries.items() if uid in seen}
        return MappingProxyType(bound), frozenset(lse)

    def with_bound_pods(self, node: NodeFacts, pods: Iterable[PodFacts]) -> NodeFacts:
        """``node`` with ``bound_cpusets`` and ``lse_pods`` taken from ``pods``."""
        bound, lse = self.bound(pods)
        return node.replace(bound_cpusets=bound, lse_pods=lse)
