"""Plans: what a plugin wants done, recorded as data, never as a side effect.

A plugin creates a ``Plan``, records its intent through the setters (``set_resource``,
``set_env``, ``write``...) and returns it. The proxy's pipeline folds the plans of all plugins
into one ``Plan`` with ``merge``, which claims every field for the plugin that set it first and
reports a ``Conflict`` when a later plugin wants a different value for a claimed field (never a
silent last-writer-wins). Only ``runtime_proxy.host.apply`` turns a plan into I/O.

What each part of a plan means:

- ``resources``, ``envs``, ``annotations``, ``labels``, ``cgroup_parent``: changes to the CRI
  request (at a ``Pre*`` stage) or, at the ``Reconcile`` stage, container resources to update
  through the runtime (``UpdateContainerResources``). ``resources`` is a ``ResourceChanges``: a
  frozen value with one typed field per ``LinuxContainerResources`` field (``None`` = not
  changed), read as a mapping of the changed fields, in the proto's field order.
- ``writes``: cgroup and resctrl files, each ``{level, path, file, value}``. ``path`` is relative
  to the level's root: the cgroup root for ``kubeqos``, ``pod``, ``sandbox``, ``container`` and
  ``host-app``; the resctrl root for ``resctrl``. ``file`` uses cgroup v1 names
  (``cpu.cfs_quota_us``); the applier translates them for cgroup v2. Writes of a ``Pre*`` stage
  are performed after the runtime accepted the call, so a rejected call changes nothing.
- ``moves``: put every task of a cgroup into a resctrl group.
- ``removals``: directories to delete (resctrl groups that went away with their pod).
- ``evictions``: pods to evict, each ``{uid, namespace, name, feature, reason}`` (only the
  ``ReconcileUsage`` stage plans them; the usage loop evicts through the Kubernetes Eviction API
  or, when configured, by stopping the pod's containers through the runtime).
- ``skipped``: what a plugin chose not to do and why (malformed input, unsupported kernel).
- ``records``: what a plugin decided, reported to the loop that runs its stage (``Record``
  subclasses, for example ``hooks.usage.SuppressDecision`` for a metric, or state the plugin
  wants back in the next round's facts). Records change nothing on the node: the applier never
  reads them, and ``to_json`` leaves them out.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeAlias, overload

from hooks.facts import HugepageLimit, ResourceValue, resource_value

__all__ = [
    "LEVELS",
    "CgroupWrite",
    "Conflict",
    "Eviction",
    "JsonValue",
    "Plan",
    "PlanError",
    "Record",
    "Removal",
    "ResourceChanges",
    "Skip",
    "TaskMove",
    "merge",
]

# A JSON document as ``json.dumps`` writes it (what ``to_json`` methods return).
JsonValue: TypeAlias = "str | int | float | bool | Sequence[JsonValue] | Mapping[str, JsonValue] | None"


class PlanError(ValueError):
    """A plugin recorded something a plan cannot hold (an unknown resource field, a value of
    another type). Raised by the setter, so the plugin's plan is refused as a whole."""

LEVELS = ("kubeqos", "pod", "sandbox", "container", "host-app", "resctrl")


@dataclass(frozen=True)
class CgroupWrite:
    """One file write. ``path`` is relative to the root of ``level`` (see module docstring)."""

    level: str
    path: str
    file: str
    value: str

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"unknown write level {self.level!r}")
        if not self.file or "/" in self.file or self.file in (".", ".."):
            raise ValueError(f"bad file name {self.file!r}")

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.level, self.path, self.file)

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "path": self.path, "file": self.file, "value": self.value}


@dataclass(frozen=True)
class TaskMove:
    """Move the tasks of the cgroup at ``path`` (level ``container`` or ``sandbox``) into the
    resctrl group ``group`` (relative to the resctrl root)."""

    level: str
    path: str
    group: str

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "path": self.path, "group": self.group}


@dataclass(frozen=True)
class Removal:
    """Remove the directory ``path`` at ``level`` (for example a pod's resctrl group)."""

    level: str
    path: str

    def to_json(self) -> dict[str, str]:
        return {"level": self.level, "path": self.path}


@dataclass(frozen=True)
class Eviction:
    """Evict the pod ``uid`` (``namespace/name``) because of ``feature`` (``BEMemoryEvict``,
    ``BECPUEvict``...); ``reason`` is the human-readable message for the Event."""

    uid: str
    namespace: str
    name: str
    feature: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "feature": self.feature,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Skip:
    """Something a plugin did not do, and why. ``plugin`` is filled in by ``merge``."""

    reason: str
    plugin: str = ""

    def to_json(self) -> dict[str, str]:
        return {"plugin": self.plugin, "reason": self.reason}


IntResource = Literal[
    "cpu_period", "cpu_quota", "cpu_shares", "memory_limit_in_bytes", "oom_score_adj", "memory_swap_limit_in_bytes"
]
StrResource = Literal["cpuset_cpus", "cpuset_mems"]


def _checked(name: str, value: object) -> ResourceValue:
    try:
        return resource_value(name, value)
    except ValueError as exc:
        raise PlanError(str(exc)) from exc


@dataclass(frozen=True, eq=False, repr=False)
class ResourceChanges(Mapping[str, ResourceValue]):
    """Changes to a container's CRI ``LinuxContainerResources``: one field per proto field,
    ``None`` when the plan leaves it alone, else the value in its one shape
    (``hooks.facts.ResourceValue``; checked when made, ``PlanError`` otherwise).

    Read as a mapping, it holds the changed fields only, in the proto's field order, and it
    equals any mapping with the same items (``plan.resources == {"cpu_shares": 2}``)."""

    cpu_period: int | None = None
    cpu_quota: int | None = None
    cpu_shares: int | None = None
    memory_limit_in_bytes: int | None = None
    oom_score_adj: int | None = None
    cpuset_cpus: str | None = None
    cpuset_mems: str | None = None
    memory_swap_limit_in_bytes: int | None = None
    unified: Mapping[str, str] | None = None
    hugepage_limits: tuple[HugepageLimit, ...] | None = None
    # The fields above that are set, in field order (what the mapping reads); made with them.
    _changed: dict[str, ResourceValue] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        changed: dict[str, ResourceValue] = {}
        for name in _RESOURCE_FIELDS:
            value = getattr(self, name)
            if value is not None:
                changed[name] = _checked(name, value)
                object.__setattr__(self, name, changed[name])
        object.__setattr__(self, "_changed", changed)

    @classmethod
    def _of(cls, changed: Mapping[str, ResourceValue]) -> ResourceChanges:
        """From values already in their shape (no check), kept in field order."""
        out = object.__new__(cls)
        ordered = {name: changed[name] for name in _RESOURCE_FIELDS if name in changed}
        attributes = out.__dict__  # a frozen dataclass is filled once, here, as in __init__
        attributes.update(_UNSET)
        attributes.update(ordered)
        attributes["_changed"] = ordered
        return out

    @classmethod
    def parse(cls, data: Mapping[str, object]) -> ResourceChanges:
        """From field names and values (hugepage limits and ``unified`` in their JSON shape
        too); ``PlanError`` for a name that is no field or a value that does not fit it."""
        if type(data) is ResourceChanges:
            return data
        if not _FIELD_SET.issuperset(data):
            raise PlanError(f"unknown resource fields: {sorted(set(data) - _FIELD_SET)}")
        return cls._of({name: _checked(name, value) for name, value in data.items()})

    def merged(self, later: Mapping[str, object]) -> ResourceChanges:
        """These changes with ``later``'s over them, field by field (``PlanError`` as ``parse``)."""
        if not later:
            return self
        if not self._changed:
            return ResourceChanges.parse(later)
        return ResourceChanges._of({**self._changed, **ResourceChanges.parse(later)._changed})

    def to_json(self) -> dict[str, JsonValue]:
        """The changed fields as JSON (``unified`` an object, hugepage limits
        ``[{"page_size", "limit"}]``, as ``hooks.facts.Resources.to_dict`` writes them)."""
        out: dict[str, JsonValue] = {}
        for name, value in self._changed.items():
            if isinstance(value, int | str):
                out[name] = value
            elif isinstance(value, tuple):
                out[name] = [{"page_size": page, "limit": limit} for page, limit in value]
            else:
                out[name] = dict(value)
        return out

    # -- the mapping of changed fields --------------------------------------------------------

    def __getitem__(self, name: str) -> ResourceValue:
        return self._changed[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._changed)

    def __len__(self) -> int:
        return len(self._changed)

    def __contains__(self, name: object) -> bool:
        return name in self._changed

    def __repr__(self) -> str:
        return f"ResourceChanges({', '.join(f'{k}={v!r}' for k, v in self.items())})"


_RESOURCE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ResourceChanges) if f.init)
_FIELD_SET = frozenset(_RESOURCE_FIELDS)
_UNSET = dict.fromkeys(_RESOURCE_FIELDS)
_NO_CHANGES = ResourceChanges()


@dataclass(frozen=True, slots=True)
class Record:
    """Base of what a plugin reports beside its plan (``Plan.records``): frozen data the loop
    running the stage reads (``hooks.usage`` defines the record types of the loops' stages).
    The merge treats a record as a claim on ``key``: two plugins that report different records
    with one key conflict."""

    @property
    def key(self) -> str:
        """What the record is about (default: its type; one per plan)."""
        return type(self).__name__


# What a plan claims a field with: a value in its JSON shape, or a record.
ClaimValue: TypeAlias = "JsonValue | Record"


@dataclass(frozen=True)
class Conflict:
    """Two plugins wanted different values for the same field."""

    field: str
    first: str
    second: str
    first_value: ClaimValue
    second_value: ClaimValue

    def __str__(self) -> str:
        return (
            f"plugins {self.first!r} and {self.second!r} both set {self.field}: "
            f"{self.first_value!r} vs {self.second_value!r}"
        )


@dataclass
class Plan:
    """Intent recorded by one plugin, or the merge of several. Plugins only use the setters."""

    resources: ResourceChanges = field(default_factory=lambda: _NO_CHANGES)
    envs: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    cgroup_parent: str | None = None
    writes: list[CgroupWrite] = field(default_factory=list)
    moves: list[TaskMove] = field(default_factory=list)
    removals: list[Removal] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.resources, ResourceChanges):  # a plain mapping from untyped code
            self.resources = ResourceChanges.parse(self.resources)

    # -- setters (the only way plugins should fill a plan) --------------------------------

    @overload
    def set_resource(self, name: IntResource, value: int) -> Plan: ...
    @overload
    def set_resource(self, name: StrResource, value: str) -> Plan: ...
    @overload
    def set_resource(self, name: Literal["unified"], value: Mapping[str, str]) -> Plan: ...
    @overload
    def set_resource(self, name: Literal["hugepage_limits"], value: Iterable[HugepageLimit]) -> Plan: ...

    def set_resource(self, name: str, value: object) -> Plan:
        """Set a CRI ``LinuxContainerResources`` field (snake-case proto name) to a value of its
        type (see ``ResourceChanges``); ``PlanError`` for an unknown field or a wrong type."""
        if name == "hugepage_limits" and isinstance(value, Iterable) and not isinstance(value, list | tuple):
            value = tuple(value)
        if name not in _FIELD_SET:
            raise PlanError(f"unknown resource fields: {[name]}")
        self.resources = ResourceChanges._of({**self.resources._changed, name: _checked(name, value)})
        return self

    def set_env(self, key: str, value: str) -> Plan:
        self.envs[key] = value
        return self

    def set_annotation(self, key: str, value: str) -> Plan:
        self.annotations[key] = value
        return self

    def set_label(self, key: str, value: str) -> Plan:
        self.labels[key] = value
        return self

    def set_cgroup_parent(self, value: str) -> Plan:
        self.cgroup_parent = value
        return self

    def write(self, level: str, path: str, file: str, value: str | int) -> Plan:
        self.writes.append(CgroupWrite(level, path, file, str(value)))
        return self

    def move_tasks(self, level: str, path: str, group: str) -> Plan:
        self.moves.append(TaskMove(level, path, group))
        return self

    def remove(self, level: str, path: str) -> Plan:
        self.removals.append(Removal(level, path))
        return self

    def evict(self, uid: str, namespace: str, name: str, feature: str, reason: str) -> Plan:
        self.evictions.append(Eviction(uid, namespace, name, feature, reason))
        return self

    def skip(self, reason: str) -> Plan:
        self.skipped.append(Skip(reason))
        return self

    def report(self, record: Record) -> Plan:
        """Report a decision to the loop that runs the stage (see ``Record``)."""
        self.records.append(record)
        return self

    # -- reading ---------------------------------------------------------------------------

    def is_empty(self) -> bool:
        """True when the plan changes nothing (skips and records alone change nothing)."""
        return not (
            self.resources
            or self.envs
            or self.annotations
            or self.labels
            or self.cgroup_parent is not None
            or self.writes
            or self.moves
            or self.removals
            or self.evictions
        )

    def is_blank(self) -> bool:
        """True when the plan holds nothing at all: ``is_empty`` with no skips and no records
        either (merging it changes nothing)."""
        return self.is_empty() and not (self.skipped or self.records)

    def files(self, writes: Iterable[CgroupWrite] | None = None) -> Plan:
        """The file part of the plan, the only part the applier performs: its writes (or
        ``writes`` instead of them), task moves and removals, in fresh lists."""
        return Plan(writes=list(self.writes if writes is None else writes), moves=list(self.moves),
                    removals=list(self.removals))

    def cri_json(self) -> dict[str, JsonValue]:
        out: dict[str, JsonValue] = {}
        if self.resources:
            out["resources"] = self.resources.to_json()
        if self.envs:
            out["envs"] = dict(self.envs)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.cgroup_parent is not None:
            out["cgroupParent"] = self.cgroup_parent
        return out

    def to_json(self) -> dict[str, JsonValue]:
        """The planner's output shape: ``cri``, ``writes``, ``moves``, ``removals``, ``skipped``,
        and ``evictions`` when there are any."""
        out: dict[str, JsonValue] = {
            "cri": self.cri_json(),
            "writes": [w.to_json() for w in self.writes],
            "moves": [m.to_json() for m in self.moves],
            "removals": [r.to_json() for r in self.removals],
            "skipped": [s.to_json() for s in self.skipped],
        }
        if self.evictions:
            out["evictions"] = [e.to_json() for e in self.evictions]
        return out


@dataclass
class _Claims:
    owners: dict[str, tuple[str, ClaimValue]] = field(default_factory=dict)

    def claim(self, key: str, plugin: str, value: ClaimValue) -> Conflict | None:
        held = self.owners.get(key)
        if held is None:
            self.owners[key] = (plugin, value)
            return None
        if held[1] == value:
            return None
        return Conflict(key, held[0], plugin, held[1], value)


def _claims_of(plan: Plan) -> Iterable[tuple[str, ClaimValue]]:
    # Resource values are claimed in their JSON shape (what a conflict reports).
    for k, v in plan.resources.to_json().items():
        yield f"resources.{k}", v
    for k, v in plan.envs.items():
        yield f"envs.{k}", v
    for k, v in plan.annotations.items():
        yield f"annotations.{k}", v
    for k, v in plan.labels.items():
        yield f"labels.{k}", v
    if plan.cgroup_parent is not None:
        yield "cgroupParent", plan.cgroup_parent
    # A plan may write one file more than once (a two-pass leveled write: the union first,
    # the target last); what it claims is the value it leaves behind.
    final: dict[str, str] = {}
    for w in plan.writes:
        final[f"write:{w.level}:{w.path}:{w.file}"] = w.value
    yield from final.items()
    for r in plan.records:
        yield f"record:{r.key}", r


class MergeResult:
    """The folded plan plus the conflicts found. A plugin with a conflict contributes nothing:
    its whole plan is left out, so no plugin is ever half-applied."""

    def __init__(self) -> None:
        self.plan = Plan()
        self.conflicts: list[Conflict] = []
        self.rejected: list[str] = []
        self.owners: dict[str, str] = {}
        self._claims = _Claims()

    def add(self, plugin: str, plan: Plan) -> list[Conflict]:
        """Fold ``plan`` in for ``plugin``; returns its conflicts (empty when it merged)."""
        # The plan's claims are tried on top of the folded ones without copying those: the new
        # claims are kept aside and join the folded ones only when none conflicts.
        held = self._claims.owners
        trial = _Claims()
        claims = list(_claims_of(plan))
        found: list[Conflict] = []
        for key, value in claims:
            earlier = held.get(key)
            conflict = trial.claim(key, plugin, value) if earlier is None else (
                None if earlier[1] == value else Conflict(key, earlier[0], plugin, earlier[1], value))
            if conflict is not None:
                found.append(conflict)
        if found:
            self.conflicts.extend(found)
            self.rejected.append(plugin)
            return found
        held.update(trial.owners)
        target = self.plan
        target.resources = target.resources.merged(plan.resources)
        target.envs.update(plan.envs)
        target.annotations.update(plan.annotations)
        target.labels.update(plan.labels)
        if plan.cgroup_parent is not None:
            target.cgroup_parent = plan.cgroup_parent
        seen = {w.key for w in target.writes}
        target.writes.extend(w for w in plan.writes if w.key not in seen)
        target.moves.extend(plan.moves)
        target.removals.extend(plan.removals)
        evicted = {e.uid for e in target.evictions}
        target.evictions.extend(e for e in plan.evictions if e.uid not in evicted)
        target.skipped.extend(Skip(s.reason, s.plugin or plugin) for s in plan.skipped)
        reported = {r.key for r in target.records}
        target.records.extend(r for r in plan.records if r.key not in reported)
        for key, _ in claims:
            self.owners.setdefault(key, plugin)
        return []


def merge(plans: Iterable[tuple[str, Plan | None]]) -> MergeResult:
    """Fold ``(plugin name, plan)`` pairs in order. ``None`` plans are "no opinion"."""
    result = MergeResult()
    for name, plan in plans:
        if plan is not None:
            result.add(name, plan)
    return result


def plan_from_json(data: Mapping[str, Any]) -> Plan:  # Any: JSON, read before anything checked its shape
    """Inverse of ``Plan.to_json`` (the tests build expected plans with it)."""
    plan = Plan()
    cri = data.get("cri", {})
    plan.resources = ResourceChanges.parse(cri.get("resources", {}))
    plan.envs.update(cri.get("envs", {}))
    plan.annotations.update(cri.get("annotations", {}))
    plan.labels.update(cri.get("labels", {}))
    if "cgroupParent" in cri:
        plan.cgroup_parent = cri["cgroupParent"]
    for w in data.get("writes", []):
        plan.write(w["level"], w["path"], w["file"], w["value"])
    for m in data.get("moves", []):
        plan.move_tasks(m["level"], m["path"], m["group"])
    for r in data.get("removals", []):
        plan.remove(r["level"], r["path"])
    for e in data.get("evictions", []):
        plan.evict(e["uid"], e["namespace"], e["name"], e["feature"], e["reason"])
    for s in data.get("skipped", []):
        plan.skipped.append(Skip(s["reason"], s.get("plugin", "")))
    return plan
