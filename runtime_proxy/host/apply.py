"""The single applier: turns the file part of a merged ``Plan`` into cgroup and resctrl I/O.

``Applier`` is the interface every caller holds; ``FileApplier`` performs plans and
``RecordingApplier`` (dry-run, chosen by the composition root) records and logs them.

Called (``Applier.apply``) by the lifecycle core (``runtime_proxy.engine.lifecycle``: the one
place a stage's plan is applied, for the CRI door, the NRI door and the hook server); and
(``apply_files``) by the reconciler
(``runtime_proxy.loops.reconciler``, ``diff=True``), by the burst loop
(``runtime_proxy.loops.burst``) and by the usage loop (``runtime_proxy.loops.qos``,
``ordered=True``). Wire changes are not made here (each door's codec makes them);
this module performs ``plan.writes``, ``plan.moves`` and ``plan.removals`` and returns an
``ApplyReport``.

Order (so the kernel never sees a child outside its parent):
    1. writes that grow a limit (``cpuset.cpus``/``cpuset.mems`` supersets, a larger
       ``cpu.cfs_quota_us`` or ``memory.limit_in_bytes``), parents before children; a cpuset
       that moves sideways first grows to the union of old and new here;
    2. every other cgroup write, in plan order;
    3. writes that shrink a limit, children before parents;
    4. resctrl writes (creating groups), then task moves, then removals.
With ``ordered=True`` the cgroup writes keep plan order instead (the plan orders them itself).
All-or-nothing attempt: when a write fails, the writes this call already made are restored
(in reverse order) and the error is reported; later writes, moves and removals are not tried.
A file the kernel lacks is ``unsupported``: reported (once in the log), never an error.
``diff=True`` (the reconciler) counts every write that changed a file as drift.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

import structlog

from hooks.plan import CgroupWrite, JsonValue, Plan, Removal, TaskMove
from koord_formats.cpulist import format_cpu_list, parse_cpu_list
from runtime_proxy.host.cgroups import CgroupError, CgroupMissingError, Cgroups, WriteResult
from runtime_proxy.host.resctrl import Resctrl

__all__ = [
    "Applier",
    "ApplyError",
    "ApplyReport",
    "FileApplier",
    "RecordingApplier",
    "apply_files",
    "order_writes",
]

log = structlog.get_logger("runtime_proxy.host.apply")

_ORDERED = ("cpuset.cpus", "cpuset.mems", "cpu.cfs_quota_us", "memory.limit_in_bytes")


@dataclass
class ApplyReport:
    """What ``apply_files`` did. ``errors`` empty means everything in the plan was applied."""

    compare_only: bool = False
    # One entry per write tried: (write, result status).
    results: list[tuple[CgroupWrite, WriteResult]] = field(default_factory=list)
    unsupported: list[CgroupWrite] = field(default_factory=list)
    # (move, number of thread ids moved).
    moved: list[tuple[TaskMove, int]] = field(default_factory=list)
    removed: list[Removal] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Files restored after a failed write.
    rolled_back: list[str] = field(default_factory=list)
    # Writes that found a different value on disk (diff mode only).
    drift: list[CgroupWrite] = field(default_factory=list)
    # Writes skipped because their cgroup directory does not exist (``missing_ok`` only).
    missing: list[CgroupWrite] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def changed(self) -> list[CgroupWrite]:
        return [w for w, r in self.results if r.status in ("written", "would-write")]

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "dryRun": self.compare_only,
            "changed": [w.to_json() for w in self.changed],
            "unchanged": [w.to_json() for w, r in self.results if r.status == "unchanged"],
            "unsupported": [w.to_json() for w in self.unsupported],
            "moved": [dict(m.to_json(), tasks=n) for m, n in self.moved],
            "removed": [r.to_json() for r in self.removed],
            "errors": list(self.errors),
            "rolledBack": list(self.rolled_back),
            "drift": len(self.drift),
            "missing": [w.to_json() for w in self.missing],
        }


def _depth(path: str) -> int:
    return len([p for p in path.split("/") if p])


def _limit(value: str) -> float:
    n = int(value)
    return float("inf") if n < 0 or n >= 1 << 62 else float(n)


@dataclass(frozen=True)
class _Step:
    write: CgroupWrite
    value: str  # the value written in this step (a union for the first half of a sideways move)
    final: bool  # False for the intermediate union step


def _classify(
    writes: list[CgroupWrite], current: Callable[[CgroupWrite], str | None]
) -> tuple[list[_Step], list[_Step], list[_Step]]:
    grow: list[_Step] = []
    other: list[_Step] = []
    shrink: list[_Step] = []
    for w in writes:
        if w.file not in _ORDERED:
            other.append(_Step(w, w.value, True))
            continue
        try:
            cur = current(w)
        except CgroupError:
            cur = None
        if cur is None:
            other.append(_Step(w, w.value, True))
            continue
        try:
            if w.file.startswith("cpuset."):
                new_set, old_set = parse_cpu_list(w.value), parse_cpu_list(cur)
                if new_set >= old_set:
                    grow.append(_Step(w, w.value, True))
                elif new_set <= old_set:
                    shrink.append(_Step(w, w.value, True))
                else:
                    grow.append(_Step(w, format_cpu_list(new_set | old_set), False))
                    shrink.append(_Step(w, w.value, True))
            elif _limit(w.value) >= _limit(cur):
                grow.append(_Step(w, w.value, True))
            else:
                shrink.append(_Step(w, w.value, True))
        except ValueError:
            other.append(_Step(w, w.value, True))
    grow.sort(key=lambda s: _depth(s.write.path))
    shrink.sort(key=lambda s: -_depth(s.write.path))
    return grow, other, shrink


def order_writes(
    writes: list[CgroupWrite], current: Callable[[CgroupWrite], str | None], phase: str = "all"
) -> list[_Step]:
    """The cgroup writes in a safe order (see module docstring). ``current`` reads a file.

    ``phase`` "grow" keeps the first two parts (growing writes, the union step of a sideways
    cpuset, every other write); "shrink" keeps only the third (writes that shrink a limit,
    read again when called); "all" keeps everything."""
    grow, other, shrink = _classify(writes, current)
    if phase == "grow":
        return grow + other
    if phase == "shrink":
        return shrink
    return grow + other + shrink


def apply_files(
    plan: Plan,
    *,
    cgroups: Cgroups,
    resctrl: Resctrl | None = None,
    compare_only: bool = False,
    diff: bool = False,
    atomic: bool = True,
    missing_ok: bool = False,
    ordered: bool = False,
    phase: str = "all",
) -> ApplyReport:
    """Perform the writes, task moves and removals of ``plan``.

    :param plan: a merged plan; only ``writes``, ``moves`` and ``removals`` are used.
    :param cgroups: the cgroup tree (``runtime_proxy.host.cgroups.Cgroups``).
    :param resctrl: the resctrl tree; resctrl writes, moves and removals fail without it.
    :param compare_only: read and compare only; ``changed`` lists what would be written.
    :param diff: reconciler mode: a write that changes a file is counted in ``drift``.
    :param atomic: restore this call's writes when one fails (default); ``False`` goes on
        with the other writes and reports every failure.
    :param missing_ok: a write whose cgroup directory does not exist is listed in ``missing``
        (not logged, not an error) and the other writes go on; the caller decides what to say.
    :param ordered: perform the cgroup writes exactly in plan order instead of the safe order
        above, for a plan that sequences its own writes (the ``ReconcileUsage`` stage's
        two-pass leveled writes, run by ``runtime_proxy.loops.qos``).
    :param phase: "all" (default); "grow" performs only the cgroup writes that grow a limit
        (parents first), the union step of a sideways cpuset and every other cgroup write;
        "shrink" only the cgroup writes that shrink a limit (children first). A leveled update
        calls "grow" on the upper level, updates the lower one, then calls "shrink" on the
        upper level, so a child never exceeds its parent (Koordinator's
        ``LeveledUpdateBatch``). Resctrl writes, moves and removals belong to "all" and "grow".
        Only "all" goes with ``ordered``.
    :returns: the report; never raises for I/O errors.
    """
    if phase not in ("all", "grow", "shrink") or (ordered and phase != "all"):
        raise ValueError(f"phase {phase!r} does not go with ordered={ordered}")
    run = _Run(cgroups, resctrl, compare_only=compare_only, diff=diff, atomic=atomic, missing_ok=missing_ok)
    cg_writes = [w for w in plan.writes if w.level != "resctrl"]
    rc_writes = [w for w in plan.writes if w.level == "resctrl"] if phase != "shrink" else []
    if ordered:
        steps = [_Step(w, w.value, True) for w in cg_writes]
    else:
        steps = order_writes(cg_writes, lambda w: cgroups.read(w.path, w.file), phase)
    if run.cgroup_writes(steps) and run.resctrl_writes(rc_writes) and phase != "shrink":
        run.moves(plan.moves)
        run.removals(plan.removals)
    return run.report


class _Run:
    """One ``apply_files`` call: its report, and the restores of the writes it made so far."""

    def __init__(
        self,
        cgroups: Cgroups,
        resctrl: Resctrl | None,
        *,
        compare_only: bool,
        diff: bool,
        atomic: bool,
        missing_ok: bool,
    ) -> None:
        self.cgroups = cgroups
        self.resctrl = resctrl
        self.compare_only = compare_only
        self.diff = diff
        self.atomic = atomic
        self.missing_ok = missing_ok
        self.report = ApplyReport(compare_only=compare_only)
        self.undo: list[tuple[Callable[[], None], str]] = []

    def fail(self, message: str) -> bool:
        """Report ``message``; True when the call stops here (its writes restored)."""
        report = self.report
        report.errors.append(message)
        log.warning("apply failed", error=message, compare_only=self.compare_only)
        if not self.atomic or self.compare_only:
            return False
        for restore, what in reversed(self.undo):
            try:
                restore()
                report.rolled_back.append(what)
            except CgroupError as exc:
                report.errors.append(f"rollback of {what} failed: {exc}")
        self.undo.clear()
        return True

    def record(self, w: CgroupWrite, result: WriteResult, final: bool) -> None:
        if result.status == "unsupported":
            if final:
                self.report.unsupported.append(w)
            return
        if final:
            self.report.results.append((w, result))
            if self.diff and result.status in ("written", "would-write"):
                self.report.drift.append(w)

    def cgroup_writes(self, steps: list[_Step]) -> bool:
        """Perform the cgroup steps in order; False when a failure stopped the call."""
        cgroups = self.cgroups
        for step in steps:
            w = step.write
            try:
                result = cgroups.write(w.path, w.file, step.value, compare_only=self.compare_only)
            except CgroupMissingError as exc:
                if self.missing_ok:
                    if w not in self.report.missing:
                        self.report.missing.append(w)
                    continue
                if self.fail(f"{w.level} {w.path or '/'} {w.file}={step.value}: {exc}"):
                    return False
                continue
            except CgroupError as exc:
                if self.fail(f"{w.level} {w.path or '/'} {w.file}={step.value}: {exc}"):
                    return False
                continue
            if result.status == "written" and result.old_raw is not None:
                target, old = Path(result.target), result.old_raw
                self.undo.append((partial(cgroups.write_raw, target, old, file=w.file), result.target))
            self.record(w, result, step.final)
        return True

    def resctrl_writes(self, writes: list[CgroupWrite]) -> bool:
        """Perform the resctrl writes (creating groups); False when a failure stopped the call."""
        resctrl = self.resctrl
        for w in writes:
            if resctrl is None:
                if self.fail(f"resctrl {w.path} {w.file}: no resctrl root configured"):
                    return False
                continue
            existed = resctrl.group_dir(w.path).is_dir() if _safe_group(resctrl, w.path) else True
            try:
                result = resctrl.write(w.path, w.file, w.value, compare_only=self.compare_only)
            except CgroupError as exc:
                if self.fail(f"resctrl {w.path} {w.file}: {exc}"):
                    return False
                continue
            if result.status == "written":
                if not existed:
                    group = w.path
                    self.undo.append((partial(_remove_quietly, resctrl, group), f"resctrl group {group}"))
                elif result.old_raw is not None:
                    target, old = Path(result.target), result.old_raw
                    self.undo.append((partial(resctrl.write_raw, target, old), result.target))
            self.record(w, result, True)
        return True

    def moves(self, moves: list[TaskMove]) -> None:
        report = self.report
        for m in moves:
            if self.resctrl is None:
                report.errors.append(f"move {m.path} to {m.group}: no resctrl root configured")
                continue
            try:
                tids = self.cgroups.tasks(m.path)
                moved = self.resctrl.add_tasks(m.group, tids, compare_only=self.compare_only)
            except CgroupError as exc:
                report.errors.append(f"move tasks of {m.level} {m.path} to {m.group}: {exc}")
                continue
            report.moved.append((m, len(moved)))

    def removals(self, removals: list[Removal]) -> None:
        report = self.report
        for r in removals:
            if r.level != "resctrl" or self.resctrl is None:
                report.errors.append(f"remove {r.level} {r.path}: only resctrl groups can be removed")
                continue
            try:
                if self.resctrl.remove_group(r.path, compare_only=self.compare_only):
                    report.removed.append(r)
            except CgroupError as exc:
                report.errors.append(f"remove resctrl group {r.path}: {exc}")


def _safe_group(resctrl: Resctrl, group: str) -> bool:
    try:
        resctrl.group_dir(group)
    except CgroupError:
        return False
    return True


def _remove_quietly(resctrl: Resctrl, group: str) -> None:
    resctrl.remove_group(group)


class ApplyError(Exception):
    """A plan's files could not all be applied; ``report`` says what happened."""

    def __init__(self, report: ApplyReport, stage: str = "") -> None:
        super().__init__(f"{stage or 'apply'}: " + "; ".join(report.errors))
        self.report = report
        self.stage = stage


class Applier(Protocol):
    """What carries out a stage's effects: the one interface the engine, the doors and the loops
    hand plans to. ``FileApplier`` performs them; ``RecordingApplier`` (dry-run) records and logs
    them and touches nothing. The composition root chooses one; nothing else knows which."""

    def carries(self, plan: Plan, *, stage: str) -> bool:
        """Whether ``plan``'s effects go ahead: the part a door's reply carries (a rewritten CRI
        request, an NRI adjustment or update, a hook server's answer, a runtime update sent by a
        loop) and the file part given to ``apply``. Asked once per stage result, before either."""
        ...

    async def apply(self, plan: Plan, *, stage: str) -> None:
        """Perform the plan's file part (writes, task moves, removals) off the event loop.
        Raises ``ApplyError`` when something failed (after restoring what it had changed)."""
        ...

    def apply_files(
        self,
        plan: Plan,
        *,
        diff: bool = False,
        atomic: bool = True,
        missing_ok: bool = False,
        ordered: bool = False,
        phase: str = "all",
    ) -> ApplyReport:
        """``apply_files`` over this applier's trees, synchronously (the loops call it from a
        worker thread); never raises for I/O errors."""
        ...


class FileApplier:
    """The applier that performs plans (``Applier``) over the configured cgroup and resctrl trees.

    ``apply`` runs ``apply_files`` in a worker thread (cgroup I/O must not block the event
    loop), logs the report and raises ``ApplyError`` when something failed (after restoring
    what the plan had changed). ``last_report`` keeps the latest report for tests.
    """

    def __init__(self, *, cgroups: Cgroups, resctrl: Resctrl | None = None) -> None:
        self.cgroups = cgroups
        self.resctrl = resctrl
        self.last_report: ApplyReport | None = None

    def carries(self, plan: Plan, *, stage: str) -> bool:
        """True: a file applier carries out every plan (the dry run is ``RecordingApplier``)."""
        return True

    def apply_files(
        self,
        plan: Plan,
        *,
        diff: bool = False,
        atomic: bool = True,
        missing_ok: bool = False,
        ordered: bool = False,
        phase: str = "all",
    ) -> ApplyReport:
        return apply_files(
            plan, cgroups=self.cgroups, resctrl=self.resctrl, diff=diff, atomic=atomic,
            missing_ok=missing_ok, ordered=ordered, phase=phase,
        )

    def apply_now(self, plan: Plan, *, diff: bool = False, atomic: bool = True) -> ApplyReport:
        """Synchronous ``apply_files`` with this applier's trees."""
        return self.apply_files(plan, diff=diff, atomic=atomic)

    async def apply(self, plan: Plan, *, stage: str) -> None:
        report = await asyncio.to_thread(self.apply_now, plan)
        self.last_report = report
        if report.changed or report.moved or report.removed:
            log.debug(
                "plan's files applied",
                stage=stage,
                changed=len(report.changed),
                moved=sum(n for _, n in report.moved),
                removed=len(report.removed),
            )
        if report.errors:
            raise ApplyError(report, stage)


class RecordingApplier:
    """The dry-run applier (``Applier``): every plan handed to it is recorded (``plans``, as
    (stage, plan)) and logged, and nothing is changed. ``carries`` answers False, so doors reply
    with no changes, loops send no runtime updates and ``apply`` is not asked for; ``apply_files``
    only reads: with trees it compares the plan with the files (``changed`` lists what would be
    written, the reconciler's drift is still counted), without trees it reports nothing."""

    def __init__(self, *, cgroups: Cgroups | None = None, resctrl: Resctrl | None = None) -> None:
        self.cgroups = cgroups
        self.resctrl = resctrl
        self.plans: list[tuple[str, Plan]] = []
        self.last_report: ApplyReport | None = None

    def _record(self, stage: str, plan: Plan) -> None:
        self.plans.append((stage, plan))
        if len(self.plans) > _RECORDED:
            del self.plans[: len(self.plans) - _RECORDED]

    def carries(self, plan: Plan, *, stage: str) -> bool:
        if not plan.is_empty():
            self._record(stage, plan)
            log.info("dry-run plan", stage=stage, plan=plan.to_json())
        return False

    async def apply(self, plan: Plan, *, stage: str) -> None:
        if not plan.is_empty():
            self._record(stage, plan)
            log.info("dry-run: not applying", stage=stage, plan=plan.to_json())

    def apply_files(
        self,
        plan: Plan,
        *,
        diff: bool = False,
        atomic: bool = True,
        missing_ok: bool = False,
        ordered: bool = False,
        phase: str = "all",
    ) -> ApplyReport:
        if not plan.is_empty():
            self._record("files", plan)
        if self.cgroups is None:
            return ApplyReport(compare_only=True)
        report = apply_files(
            plan, cgroups=self.cgroups, resctrl=self.resctrl, compare_only=True, diff=diff, atomic=atomic,
            missing_ok=missing_ok, ordered=ordered, phase=phase,
        )
        self.last_report = report
        return report


# Plans a ``RecordingApplier`` keeps (the oldest go first): a dry run may last for months.
_RECORDED = 1024
