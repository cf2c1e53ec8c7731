"""Writes waiting for a container id: the one rule every door follows.

A ``PreCreateContainer`` plan is made before the runtime has named or created the container, so
a plugin that joins the container's id into a cgroup path joins an empty one. Such a write is
completed with the id, once, here:

- **Which write lacks its id**: a ``container`` or ``sandbox`` write whose path is empty, ends
  with "/" (the cgroupfs layout of ``hooks.facts.container_cgroup_path``: ``<pod>/<id>``) or
  ends with ``cri-containerd-.scope`` (its systemd layout: ``<pod>/cri-containerd-<id>.scope``).
- **Which write a container's id completes**: a ``container`` write only. A ``sandbox`` write
  without its id (the hook protocol carries no sandbox id) is never given a container's id.
- **A write still lacking its id when its plan is applied** is dropped with a log line
  (``complete``), never written to the pod's directory the bare path names.
- **When** (carried out by ``runtime_proxy.engine.walk`` as the lifecycle table says; the held
  plans are the lifecycle core's ``Lifecycle.held``): the CRI door knows the id and the cgroup as
  soon as the runtime answered CreateContainer and completes the plan at once. The NRI door and
  the hook server see CreateContainer before the container's cgroup exists: the file part is
  held and taken at the first of StartContainer and PostStartContainer of that container; at
  the NRI door it is forgotten at RemoveContainer. The NRI door holds the whole file part (the container's cgroup
  does not exist yet); the hook server holds only the writes that lack the id and applies the
  rest before answering, since its caller may not send it a StartContainer hook.
- **Bound**: at most ``LIMIT`` plans wait; the oldest is dropped with a warning.

The key is the container id where the door knows it at create (NRI), else the pod uid, container
name and attempt (the hook server, whose PreCreateContainer request carries no id).

Before this module the rule existed three times: the CRI door completed only cgroupfs paths of
``container`` writes; the hook server also gave ``sandbox`` writes the container's id (so they
landed in the container's cgroup) and kept at most 1024; the NRI door kept 4096 and completed
nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import replace
from typing import Generic, TypeVar

import structlog

from hooks.plan import CgroupWrite, Plan

log = structlog.get_logger(__name__)

__all__ = ["LIMIT", "Pending", "complete", "lacks_id"]

LIMIT = 4096
_SCOPE = "cri-containerd-.scope"

K = TypeVar("K", bound=Hashable)


def lacks_id(write: CgroupWrite) -> bool:
    """Whether ``write`` is a container or sandbox write planned without the id."""
    if write.level not in ("container", "sandbox"):
        return False
    return not write.path or write.path.endswith("/") or write.path.endswith(_SCOPE)


def _with_id(path: str, container_id: str) -> str:
    if path.endswith(_SCOPE):
        return f"{path[:-len('.scope')]}{container_id}.scope"
    return path + container_id


def complete(plan: Plan, container_id: str, stage: str) -> Plan:
    """``plan`` with its ``container`` writes that lack the id given ``container_id`` (none when
    it is empty); a write that still lacks its id is dropped and logged. The same plan when no
    write lacks an id."""
    if not any(lacks_id(w) for w in plan.writes):
        return plan
    writes: list[CgroupWrite] = []
    dropped: list[CgroupWrite] = []
    for w in plan.writes:
        if not lacks_id(w):
            writes.append(w)
        elif w.level == "container" and container_id:
            writes.append(CgroupWrite(w.level, _with_id(w.path, container_id), w.file, w.value))
        else:
            dropped.append(w)
    if dropped:
        log.info("writes without a container or sandbox id dropped", stage=stage,
                 writes=[w.to_json() for w in dropped])
    return replace(plan, writes=writes)


class Pending(Generic[K]):
    """File parts of ``PreCreateContainer`` plans waiting for their container (see the module
    docstring), oldest first, at most ``limit``."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self._plans: OrderedDict[K, Plan] = OrderedDict()

    def __len__(self) -> int:
        return len(self._plans)

    def hold(self, key: K, files: Plan) -> None:
        """Keep ``files`` (a file part; nothing when empty) until ``take(key)``."""
        if files.is_empty():
            return
        self._plans[key] = files
        self._plans.move_to_end(key)
        while len(self._plans) > self.limit:
            dropped, _ = self._plans.popitem(last=False)
            log.warning("writes waiting for their container dropped (too many waiting)", container=str(dropped))

    def take(self, key: K, container_id: str) -> Plan | None:
        """The file part held for ``key``, completed with ``container_id`` (None when none)."""
        files = self._plans.pop(key, None)
        return None if files is None else complete(files, container_id, "PreCreateContainer")

    def drop(self, key: K) -> None:
        self._plans.pop(key, None)
