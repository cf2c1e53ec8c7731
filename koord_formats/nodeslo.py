"""NodeSLO ``spec`` strategies with Koordinator's defaults, read from the decoded spec.

The spec arrives as a mapping (from the API server or a YAML file). Every accessor here reads
one strategy, fills what is missing with Koordinator's default and never raises: a value of the
wrong type or out of range is reported in ``problems`` (when given) and replaced by the
default, as koordlet falls back to its defaults (except the resctrlQOS percentages, which are
kept as given for the ``rdt`` plugin to refuse, see ``resctrl_qos``). ``validate_node_slo`` raises
``FormatError`` for the first such value, for callers that refuse a bad spec as a whole.

Defaults: ``pkg/util/sloconfig/nodeslo_config.go`` (``DefaultCPUQOS``, ``DefaultResctrlQOS``,
``DefaultCPUBurstConfig``, ``DefaultResourceThresholdStrategy``); field names and ranges:
``apis/slo/v1alpha1/nodeslo_types.go``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koord_formats import keys
from koord_formats.bounded import load_json
from koord_formats.errors import FormatError
from koord_formats.keys import SLO

__all__ = [
    "CPUQOS",
    "DEFAULT_CPU_BURST",
    "DEFAULT_GROUP_IDENTITY",
    "DEFAULT_RESCTRL",
    "MAX_CPU_EVICT_WINDOW_SECONDS",
    "MEMORY_EVICT_LOWER_GAP",
    "CPUBurstConfig",
    "CPUSuppress",
    "Eviction",
    "HostApplication",
    "HostCgroupPath",
    "MemoryQOS",
    "PodMemoryQOS",
    "ResctrlQOS",
    "class_bvt_value",
    "cpu_burst",
    "cpu_burst_from_pod",
    "cpu_policy",
    "cpu_qos",
    "cpu_suppress",
    "eviction",
    "group_identity_enabled",
    "host_application",
    "host_applications",
    "memory_qos",
    "memory_qos_configured",
    "memory_qos_for_pod",
    "parse_pod_memory_qos",
    "resctrl_qos",
    "section",
    "validate_node_slo",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})

# groupIdentity per class (DefaultCPUQOS: LSR 2, LS 2, BE -1; classes without a default, such as
# systemClass, take NoneCPUQOS's 0).
DEFAULT_GROUP_IDENTITY = {SLO.LSR_CLASS: 2, SLO.LS_CLASS: 2, SLO.BE_CLASS: -1, SLO.SYSTEM_CLASS: 0}
# (catRangeStartPercent, catRangeEndPercent, mbaPercent) per class (DefaultResctrlQOS; others
# take NoneResctrlQOS's 0, 100, 100).
DEFAULT_RESCTRL = {SLO.LSR_CLASS: (0, 100, 100), SLO.LS_CLASS: (0, 100, 100), SLO.BE_CLASS: (0, 30, 100)}


def section(spec: object, *path: str) -> Mapping[str, Any]:
    """The mapping at ``path`` inside ``spec``; empty when any step is missing or not a mapping."""
    data = spec
    for key in path:
        if not isinstance(data, Mapping):
            return _EMPTY
        data = data.get(key)
    return data if isinstance(data, Mapping) else _EMPTY


def _typed(sec: Mapping[str, Any], key: str, kind: type, default: Any, problems: list[str] | None) -> Any:
    value = sec.get(key)
    if value is None:
        return default
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        if -(2**63) <= value < 2**63:
            return value
    elif kind is not int and isinstance(value, kind):
        return value
    if problems is not None:
        problems.append(f"NodeSLO {key}={str(value)[:64]!r} is not a valid {kind.__name__}; using {default!r}")
    return default


def _ranged(value: int, lo: int, hi: int, default: int, key: str, problems: list[str] | None) -> int:
    if lo <= value <= hi:
        return value
    if problems is not None:
        problems.append(f"NodeSLO {key}={value} is outside {lo}..{hi}; using {default}")
    return default


# ---- resourceQOSStrategy ---------------------------------------------------------------------------


def cpu_policy(spec: Mapping[str, Any]) -> str:
    """``resourceQOSStrategy.policies.cpuPolicy``: "" (group identity), "groupIdentity" or
    "coreSched"; an unknown value reads as ""."""
    value = section(spec, SLO.RESOURCE_QOS_STRATEGY, SLO.POLICIES).get(SLO.CPU_POLICY, "")
    return value if value in keys.CPU_POLICIES else ""


@dataclass(frozen=True, slots=True)
class CPUQOS:
    """``resourceQOSStrategy.<class>.cpuQOS`` after defaults."""

    enable: bool = False  # DefaultResourceQOSStrategy: false for every class
    group_identity: int = 0  # -1..2, default per class in DEFAULT_GROUP_IDENTITY
    sched_idle: int = 0  # 0 or 1; nodeslo_types.go: default 0
    core_expeller: bool = False  # nodeslo_types.go: default false


def cpu_qos(spec: Mapping[str, Any], class_key: str, problems: list[str] | None = None) -> CPUQOS:
    """cpuQOS of ``class_key`` (``SLO.LSR_CLASS``, ``LS_CLASS``, ``BE_CLASS``, ``SYSTEM_CLASS``)."""
    sec = section(spec, SLO.RESOURCE_QOS_STRATEGY, class_key, SLO.CPU_QOS)
    default_gi = DEFAULT_GROUP_IDENTITY.get(class_key, 0)
    gi = _ranged(
        _typed(sec, SLO.GROUP_IDENTITY, int, default_gi, problems), -1, 2, default_gi, SLO.GROUP_IDENTITY, problems
    )
    idle = _ranged(_typed(sec, SLO.SCHED_IDLE, int, 0, problems), 0, 1, 0, SLO.SCHED_IDLE, problems)
    return CPUQOS(
        enable=_typed(sec, SLO.ENABLE, bool, False, problems),
        group_identity=gi,
        sched_idle=idle,
        core_expeller=_typed(sec, SLO.CORE_EXPELLER, bool, False, problems),
    )


def group_identity_enabled(spec: Mapping[str, Any]) -> bool:
    """True when group identity is the CPU policy and some class enables its cpuQOS."""
    if cpu_policy(spec) not in ("", keys.CPU_POLICY_GROUP_IDENTITY):
        return False
    return any(cpu_qos(spec, k).enable for k in DEFAULT_GROUP_IDENTITY)


def class_bvt_value(spec: Mapping[str, Any], class_key: str) -> int:
    """A class's ``cpu.bvt_warp_ns``: its groupIdentity when its cpuQOS is enabled, else 0."""
    q = cpu_qos(spec, class_key)
    return q.group_identity if q.enable else 0


@dataclass(frozen=True, slots=True)
class ResctrlQOS:
    """``resourceQOSStrategy.<class>.resctrlQOS`` after defaults (DEFAULT_RESCTRL); the
    percentages may be out of range (see ``resctrl_qos``)."""

    enable: bool = False
    cat_range_start_percent: int = 0
    cat_range_end_percent: int = 100
    mba_percent: int = 100


def resctrl_qos(spec: Mapping[str, Any], class_key: str, problems: list[str] | None = None) -> ResctrlQOS:
    """resctrlQOS of ``class_key``. A value that is not an integer takes the default; an integer
    outside its range (0..100, mba 1..100) or a cache range whose end is not above its start is
    reported and kept as given, because koordlet does not substitute a default there: it refuses
    to write that group's L3 (or MB) schemata, and so does the ``rdt`` plugin."""
    sec = section(spec, SLO.RESOURCE_QOS_STRATEGY, class_key, SLO.RESCTRL_QOS)
    start, end, mba = DEFAULT_RESCTRL.get(class_key, (0, 100, 100))

    def pct(key: str, default: int, lo: int) -> int:
        value: int = _typed(sec, key, int, default, problems)
        if not lo <= value <= 100 and problems is not None:
            problems.append(f"NodeSLO {key}={value} is outside {lo}..100; the schemata is not written")
        return value

    start, end = pct(SLO.CAT_RANGE_START_PERCENT, start, 0), pct(SLO.CAT_RANGE_END_PERCENT, end, 0)
    if end <= start and problems is not None:
        problems.append(f"NodeSLO {SLO.CAT_RANGE_END_PERCENT}={end} is not above {SLO.CAT_RANGE_START_PERCENT}={start}")

    return ResctrlQOS(
        enable=_typed(sec, SLO.ENABLE, bool, False, problems),
        cat_range_start_percent=start,
        cat_range_end_percent=end,
        mba_percent=pct(SLO.MBA_PERCENT, mba, 1),
    )


@dataclass(frozen=True, slots=True)
class MemoryQOS:
    """``resourceQOSStrategy.<class>.memoryQOS`` after defaults. A class whose ``enable`` is
    false takes every "close" value (koordlet's ``NoneMemoryQOS``: percentages 0, which give
    ``memory.min`` 0, ``memory.low`` 0 and ``memory.high`` max); an enabled class takes
    ``DefaultMemoryQOS`` for what it leaves out (percentages 0 as well: protection and
    throttling are only what the NodeSLO asks for). The watermark, OOM priority and OOM group
    fields drive Anolis kernel files and are kept only to be reported."""

    enable: bool = False
    min_limit_percent: int = 0  # memory.min = request x this / 100
    low_limit_percent: int = 0  # memory.low = request x this / 100
    throttling_percent: int = 0  # memory.high = request + (limit - request) x this / 100; 0: max
    wmark_ratio: int = 0
    wmark_scale_permill: int = 50
    wmark_min_adj: int = 0
    priority_enable: int = 0
    priority: int = 0
    oom_kill_group: int = 0


# (field, key, lo, hi) of memoryQOS (nodeslo_types.go's validate tags).
_MEMORY_QOS_FIELDS = (
    ("min_limit_percent", SLO.MIN_LIMIT_PERCENT, 0, 100),
    ("low_limit_percent", SLO.LOW_LIMIT_PERCENT, 0, 100),
    ("throttling_percent", SLO.THROTTLING_PERCENT, 0, 100),
    ("wmark_ratio", SLO.WMARK_RATIO, 0, 100),
    ("wmark_scale_permill", SLO.WMARK_SCALE_PERMILL, 1, 1000),
    ("wmark_min_adj", SLO.WMARK_MIN_ADJ, -25, 50),
    ("priority_enable", SLO.PRIORITY_ENABLE, 0, 1),
    ("priority", SLO.PRIORITY, 0, 12),
    ("oom_kill_group", SLO.OOM_KILL_GROUP, 0, 1),
)
# DefaultMemoryQOS's watermark values per class (the percentages and OOM fields default to 0).
_DEFAULT_WMARK = {
    SLO.LSR_CLASS: (95, 20, -25),
    SLO.LS_CLASS: (95, 20, -25),
    SLO.BE_CLASS: (95, 20, 50),
    SLO.SYSTEM_CLASS: (0, 50, 0),
}


def memory_qos(spec: Mapping[str, Any], class_key: str, problems: list[str] | None = None) -> MemoryQOS:
    """memoryQOS of ``class_key``; a value of the wrong type or outside its range is reported
    and takes the default."""
    sec = section(spec, SLO.RESOURCE_QOS_STRATEGY, class_key, SLO.MEMORY_QOS)
    enable = _typed(sec, SLO.ENABLE, bool, False, problems)
    ratio, scale, adj = _DEFAULT_WMARK.get(class_key, (0, 50, 0))
    base = MemoryQOS(enable=enable, wmark_ratio=ratio, wmark_scale_permill=scale, wmark_min_adj=adj)
    values: dict[str, int] = {}
    for name, key, lo, hi in _MEMORY_QOS_FIELDS:
        default: int = getattr(base, name)
        values[name] = _ranged(_typed(sec, key, int, default, problems), lo, hi, default, key, problems)
    if not enable:
        return MemoryQOS()
    return MemoryQOS(enable=True, **values)


def memory_qos_configured(spec: Mapping[str, Any]) -> bool:
    """True when some class of ``resourceQOSStrategy`` has a ``memoryQOS`` section (enabled or
    not): the ``memory_qos`` plugin plans only then, so a node whose NodeSLO never names memory
    QoS keeps the files kubelet and the runtime wrote."""
    return any(section(spec, SLO.RESOURCE_QOS_STRATEGY, k).get(SLO.MEMORY_QOS) is not None for k in _CLASS_KEYS)


@dataclass(frozen=True, slots=True)
class PodMemoryQOS:
    """The pod annotation ``koordinator.sh/memoryQOS`` (Koordinator's ``PodMemoryQOSConfig``):
    a ``policy`` and memoryQOS fields of the pod's own (``fields``: attribute name of
    ``MemoryQOS`` -> value, only those the annotation gives)."""

    policy: str = ""
    fields: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


def parse_pod_memory_qos(text: object) -> PodMemoryQOS:
    """Parse the annotation ``koordinator.sh/memoryQOS``: a JSON object (at most 4096
    characters) with an optional ``policy`` (``""``, ``default``, ``none`` or ``auto``) and
    memoryQOS's integer fields (``minLimitPercent``, ``lowLimitPercent``, ``throttlingPercent``
    0..100, and the Anolis-only ones in their NodeSLO ranges). ``FormatError`` for anything
    else: another type, an unknown policy, a value out of range; unknown keys are ignored, as
    Koordinator's JSON decoding ignores them."""
    data = load_json(text, keys.ANNOTATION_POD_MEMORY_QOS, max_chars=4096)
    what = f"annotation {keys.ANNOTATION_POD_MEMORY_QOS}"
    if not isinstance(data, dict):
        raise FormatError(f"{what} must be a JSON object")
    policy = data.get("policy", "")
    if policy is None:
        policy = ""
    if not isinstance(policy, str) or policy not in keys.POD_MEMORY_QOS_POLICIES:
        raise FormatError(f"{what}: policy {str(policy)[:32]!r} is not one of default, none, auto")
    fields: dict[str, int] = {}
    for name, key, lo, hi in _MEMORY_QOS_FIELDS:
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise FormatError(f"{what}: {key} must be an integer in {lo}..{hi}, not {str(value)[:32]!r}")
        fields[name] = value
    return PodMemoryQOS(policy=policy, fields=MappingProxyType(fields))


def memory_qos_for_pod(
    node_class: MemoryQOS, class_key: str, text: str | None, problems: list[str] | None = None
) -> MemoryQOS:
    """The memoryQOS a pod gets (koordlet's cgreconcile: the pod's fields > its policy's
    template > the node's class values): ``node_class`` (the NodeSLO's values for the pod's
    class) without the annotation ``koordinator.sh/memoryQOS`` (``text``); with it, policy
    ``none`` gives every "close" value (``MemoryQOS()``), ``auto`` starts from the class's
    defaults (enabled, percentages 0) and ``default`` (or none given) from ``node_class``, and
    the fields the annotation gives replace those. A malformed annotation is reported to
    ``problems`` and ``node_class`` is kept."""
    if not text:
        return node_class
    try:
        pod = parse_pod_memory_qos(text)
    except FormatError as exc:
        if problems is not None:
            problems.append(str(exc))
        return node_class
    if pod.policy == keys.POD_MEMORY_QOS_POLICY_NONE:
        return MemoryQOS()
    base = node_class
    if pod.policy == keys.POD_MEMORY_QOS_POLICY_AUTO:
        ratio, scale, adj = _DEFAULT_WMARK.get(class_key, (0, 50, 0))
        base = MemoryQOS(enable=True, wmark_ratio=ratio, wmark_scale_permill=scale, wmark_min_adj=adj)
    if not pod.fields:
        return base
    merged = {name: getattr(base, name) for name, _key, _lo, _hi in _MEMORY_QOS_FIELDS}
    merged.update(pod.fields)
    return MemoryQOS(enable=True, **merged)


# ---- resourceUsedThresholdWithBE -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CPUSuppress:
    """The CPU-suppress part of ``resourceUsedThresholdWithBE`` after defaults
    (DefaultResourceThresholdStrategy: enable false, threshold 65, policy cpuset, no minimum)."""

    enable: bool = False
    cpu_suppress_threshold_percent: int = 65
    cpu_suppress_policy: str = keys.CPU_SUPPRESS_POLICY_CPUSET  # "cpuset" or "cfsQuota"
    # Floor of the BE share in percent of the node's capacity; None: no floor.
    cpu_suppress_min_percent: int | None = None


def cpu_suppress(spec: Mapping[str, Any], problems: list[str] | None = None) -> CPUSuppress:
    """``resourceUsedThresholdWithBE`` with its defaults; percentages outside 0..100 take the
    default (no minimum for ``cpuSuppressMinPercent``)."""
    sec = section(spec, SLO.RESOURCE_USED_THRESHOLD_WITH_BE)
    base = CPUSuppress()
    policy = _typed(sec, SLO.CPU_SUPPRESS_POLICY, str, base.cpu_suppress_policy, problems)
    if policy not in (keys.CPU_SUPPRESS_POLICY_CPUSET, keys.CPU_SUPPRESS_POLICY_CFS_QUOTA):
        if problems is not None:
            problems.append(
                f"NodeSLO {SLO.CPU_SUPPRESS_POLICY}={policy[:64]!r} is unknown; using {base.cpu_suppress_policy!r}"
            )
        policy = base.cpu_suppress_policy
    threshold = _typed(sec, SLO.CPU_SUPPRESS_THRESHOLD_PERCENT, int, base.cpu_suppress_threshold_percent, problems)
    minimum: int | None = _typed(sec, SLO.CPU_SUPPRESS_MIN_PERCENT, int, None, problems)
    if minimum is not None and not 0 <= minimum <= 100:
        if problems is not None:
            problems.append(f"NodeSLO {SLO.CPU_SUPPRESS_MIN_PERCENT}={minimum} is outside 0..100; using no minimum")
        minimum = None
    return CPUSuppress(
        enable=_typed(sec, SLO.ENABLE, bool, base.enable, problems),
        cpu_suppress_threshold_percent=_ranged(
            threshold, 0, 100, base.cpu_suppress_threshold_percent, SLO.CPU_SUPPRESS_THRESHOLD_PERCENT, problems
        ),
        cpu_suppress_policy=policy,
        cpu_suppress_min_percent=minimum,
    )


# ---- cpuBurstStrategy --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CPUBurstConfig:
    """``cpuBurstStrategy`` (NodeSLO), possibly merged with the pod's ``koordinator.sh/cpuBurst``.
    Defaults: DefaultCPUBurstConfig and DefaultCPUBurstStrategy."""

    policy: str = "none"  # none | cpuBurstOnly | cfsQuotaBurstOnly | auto
    cpu_burst_percent: int = 1000
    cfs_quota_burst_percent: int = 300
    cfs_quota_burst_period_seconds: int = -1  # -1: no limit on how long the quota stays raised
    share_pool_threshold_percent: int = 50

    @property
    def cpu_burst_enabled(self) -> bool:
        return self.policy in ("auto", "cpuBurstOnly")

    @property
    def cfs_quota_burst_enabled(self) -> bool:
        return self.policy in ("auto", "cfsQuotaBurstOnly")


DEFAULT_CPU_BURST = CPUBurstConfig()
_MAX_PERCENT = 10**6


def _burst_from(sec: Mapping[str, Any], base: CPUBurstConfig, problems: list[str] | None) -> CPUBurstConfig:
    policy = _typed(sec, SLO.POLICY, str, base.policy, problems)
    if policy not in keys.CPU_BURST_POLICIES:
        if problems is not None:
            problems.append(f"unknown cpu burst policy {policy[:64]!r}; using {base.policy!r}")
        policy = base.policy
    out = CPUBurstConfig(
        policy=policy,
        cpu_burst_percent=_typed(sec, SLO.CPU_BURST_PERCENT, int, base.cpu_burst_percent, problems),
        cfs_quota_burst_percent=_typed(sec, SLO.CFS_QUOTA_BURST_PERCENT, int, base.cfs_quota_burst_percent, problems),
        cfs_quota_burst_period_seconds=_typed(
            sec, SLO.CFS_QUOTA_BURST_PERIOD_SECONDS, int, base.cfs_quota_burst_period_seconds, problems
        ),
        share_pool_threshold_percent=_typed(
            sec, SLO.SHARE_POOL_THRESHOLD_PERCENT, int, base.share_pool_threshold_percent, problems
        ),
    )
    if (
        not 0 <= out.cpu_burst_percent <= _MAX_PERCENT
        or not 100 <= out.cfs_quota_burst_percent <= _MAX_PERCENT
        or not -1 <= out.cfs_quota_burst_period_seconds <= 10**9
        or not 0 <= out.share_pool_threshold_percent <= 100
    ):
        if problems is not None:
            problems.append("cpu burst values out of range; using the previous values")
        return base
    return out


def cpu_burst(spec: Mapping[str, Any], problems: list[str] | None = None) -> CPUBurstConfig:
    """The node's ``cpuBurstStrategy`` with Koordinator's defaults."""
    return _burst_from(section(spec, SLO.CPU_BURST_STRATEGY), DEFAULT_CPU_BURST, problems)


def cpu_burst_from_pod(
    node_config: CPUBurstConfig, text: str | None, problems: list[str] | None = None
) -> CPUBurstConfig:
    """``node_config`` with the pod annotation ``koordinator.sh/cpuBurst`` (JSON, the same keys)
    merged over it; a malformed annotation is reported and ignored."""
    if not text:
        return node_config
    try:
        data = load_json(text, keys.ANNOTATION_POD_CPU_BURST, max_chars=4096)
    except FormatError as exc:
        if problems is not None:
            problems.append(str(exc))
        return node_config
    if not isinstance(data, dict):
        if problems is not None:
            problems.append(f"annotation {keys.ANNOTATION_POD_CPU_BURST} must be a JSON object")
        return node_config
    return _burst_from(data, node_config, problems)


# ---- whole-spec validation -----------------------------------------------------------------------------

_CLASS_KEYS = (SLO.LSR_CLASS, SLO.LS_CLASS, SLO.BE_CLASS, SLO.SYSTEM_CLASS, SLO.CGROUP_ROOT)


def validate_node_slo(spec: object) -> None:
    """``FormatError`` naming the first field of the strategies above that has the wrong type,
    an unknown value or a value out of range; unknown fields are allowed."""
    if not isinstance(spec, Mapping):
        raise FormatError("NodeSLO spec must be a mapping")
    problems: list[str] = []
    for key in (SLO.RESOURCE_QOS_STRATEGY, SLO.CPU_BURST_STRATEGY, SLO.RESOURCE_USED_THRESHOLD_WITH_BE):
        if spec.get(key) is not None and not isinstance(spec.get(key), Mapping):
            problems.append(f"NodeSLO {key} must be a mapping")
    policy = section(spec, SLO.RESOURCE_QOS_STRATEGY, SLO.POLICIES).get(SLO.CPU_POLICY)
    if policy is not None and policy not in keys.CPU_POLICIES:
        problems.append(f"NodeSLO {SLO.CPU_POLICY}={str(policy)[:64]!r} is unknown")
    for class_key in _CLASS_KEYS:
        cpu_qos(spec, class_key, problems)
        resctrl_qos(spec, class_key, problems)
        memory_qos(spec, class_key, problems)
    cpu_burst(spec, problems)
    cpu_suppress(spec, problems)
    eviction(spec, problems)
    host_applications(spec, problems)
    if problems:
        raise FormatError(problems[0])


# ---- hostApplications (apis/slo/v1alpha1/host_application.go) ----------------------------------------


@dataclass(frozen=True, slots=True)
class HostCgroupPath:
    """``cgroupPath`` of a host application: ``base`` dir / ``parentDir`` / ``relativePath``."""

    base: str = "CgroupRoot"  # one of keys.HOST_APP_BASES; "" reads as CgroupRoot
    parent_dir: str = ""
    relative_path: str = ""


@dataclass(frozen=True, slots=True)
class HostApplication:
    """One entry of ``hostApplications``: a process group on the host with a QoS class."""

    name: str = ""
    qos: str = ""  # a Koordinator QoS class, "" when not given
    priority: str = ""  # a Koordinator priority class, "" when not given
    cgroup_path: HostCgroupPath | None = None  # None: derived from qos and name


_MAX_HOST_APPS = 256


def _text(doc: Mapping[str, Any], key: str, what: str) -> str:
    value = doc.get(key)
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > 4096:
        raise FormatError(f"{what} {key} must be a string of at most 4096 characters")
    return value


def host_application(data: object) -> HostApplication:
    """One decoded ``hostApplications`` entry; ``FormatError`` when it has no name, a field has
    the wrong type or ``cgroupPath.base`` is unknown."""
    if not isinstance(data, Mapping):
        raise FormatError("host application must be a mapping")
    what = "host application"
    raw = data.get(SLO.CGROUP_PATH)
    path: HostCgroupPath | None = None
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise FormatError(f"{what} {SLO.CGROUP_PATH} must be a mapping")
        base = _text(raw, SLO.BASE, what) or "CgroupRoot"
        if base not in keys.HOST_APP_BASES:
            raise FormatError(f"{what}: unknown {SLO.CGROUP_PATH} base {base[:64]!r}")
        path = HostCgroupPath(base, _text(raw, SLO.PARENT_DIR, what), _text(raw, SLO.RELATIVE_PATH, what))
    name = _text(data, SLO.NAME, what)
    if not name:
        raise FormatError(f"{what}: {SLO.NAME} is required")
    return HostApplication(
        name=name,
        qos=_text(data, SLO.QOS, what),
        priority=_text(data, SLO.PRIORITY, what),
        cgroup_path=path,
    )


def host_applications(spec: Mapping[str, Any], problems: list[str] | None = None) -> tuple[HostApplication, ...]:
    """``hostApplications`` of the spec; entries that do not decode are reported and left out."""
    raw = spec.get(SLO.HOST_APPLICATIONS)
    if raw is None:
        return ()
    if not isinstance(raw, list):
        if problems is not None:
            problems.append(f"NodeSLO {SLO.HOST_APPLICATIONS} must be a list")
        return ()
    out: list[HostApplication] = []
    for entry in raw[:_MAX_HOST_APPS]:
        try:
            out.append(host_application(entry))
        except FormatError as exc:
            if problems is not None:
                problems.append(str(exc))
    if len(raw) > _MAX_HOST_APPS and problems is not None:
        problems.append(f"NodeSLO {SLO.HOST_APPLICATIONS}: only the first {_MAX_HOST_APPS} are used")
    return tuple(out)


# ---- resourceUsedThresholdWithBE: evictions -----------------------------------------------------

MEMORY_EVICT_LOWER_GAP = 2  # memoryEvictLowerPercent defaults to the threshold minus this
MAX_CPU_EVICT_WINDOW_SECONDS = 86400


@dataclass(frozen=True, slots=True)
class Eviction:
    """The eviction part of ``resourceUsedThresholdWithBE`` after defaults
    (DefaultResourceThresholdStrategy and the plugins' own fallbacks).

    Memory eviction (BEMemoryEvict) acts at ``memory_evict_threshold_percent`` of node memory
    and frees down to ``memory_evict_lower_percent``. CPU eviction by BE satisfaction
    (BECPUEvict) is off until both satisfaction bounds are set and valid
    (``cpu_evict_enabled``)."""

    enable: bool = False
    memory_evict_threshold_percent: int = 70
    memory_evict_lower_percent: int = 68  # threshold - MEMORY_EVICT_LOWER_GAP unless given
    cpu_evict_be_satisfaction_lower_percent: int | None = None  # (0, 60]
    cpu_evict_be_satisfaction_upper_percent: int | None = None  # (0, 100), >= lower
    cpu_evict_be_usage_threshold_percent: int = 90
    cpu_evict_time_window_seconds: int | None = None  # None: one sampling interval
    cpu_evict_policy: str = keys.CPU_EVICT_POLICY_REAL_LIMIT
    evict_enabled_priority_threshold: int | None = None

    @property
    def cpu_evict_enabled(self) -> bool:
        return (
            self.cpu_evict_be_satisfaction_lower_percent is not None
            and self.cpu_evict_be_satisfaction_upper_percent is not None
        )


def _optional_int(
    sec: Mapping[str, Any], key: str, lo: int, hi: int, problems: list[str] | None
) -> int | None:
    value = _typed(sec, key, int, None, problems)
    if value is None:
        return None
    if lo <= value <= hi:
        return int(value)
    if problems is not None:
        problems.append(f"NodeSLO {key}={value} is outside {lo}..{hi}; left unset")
    return None


def eviction(spec: Mapping[str, Any], problems: list[str] | None = None) -> Eviction:
    """The eviction fields of ``resourceUsedThresholdWithBE`` with their defaults. Never raises:
    a wrong type or a value out of range is reported in ``problems`` and replaced by its
    default (for the satisfaction bounds: both left unset, so CPU eviction stays off)."""
    sec = section(spec, SLO.RESOURCE_USED_THRESHOLD_WITH_BE)
    base = Eviction()
    threshold = _ranged(
        _typed(sec, SLO.MEMORY_EVICT_THRESHOLD_PERCENT, int, base.memory_evict_threshold_percent, problems),
        0, 100, base.memory_evict_threshold_percent, SLO.MEMORY_EVICT_THRESHOLD_PERCENT, problems,
    )
    default_lower = max(threshold - MEMORY_EVICT_LOWER_GAP, 0)
    lower = _optional_int(sec, SLO.MEMORY_EVICT_LOWER_PERCENT, 0, 100, problems)
    if lower is not None and lower >= threshold:
        if problems is not None:
            problems.append(
                f"NodeSLO {SLO.MEMORY_EVICT_LOWER_PERCENT}={lower} is not below "
                f"{SLO.MEMORY_EVICT_THRESHOLD_PERCENT}={threshold}; using {default_lower}"
            )
        lower = None
    sat_lower = _optional_int(sec, SLO.CPU_EVICT_BE_SATISFACTION_LOWER_PERCENT, 1, 60, problems)
    sat_upper = _optional_int(sec, SLO.CPU_EVICT_BE_SATISFACTION_UPPER_PERCENT, 1, 99, problems)
    if sat_lower is not None and sat_upper is not None and sat_upper < sat_lower:
        if problems is not None:
            problems.append(
                f"NodeSLO {SLO.CPU_EVICT_BE_SATISFACTION_UPPER_PERCENT}={sat_upper} is below "
                f"{SLO.CPU_EVICT_BE_SATISFACTION_LOWER_PERCENT}={sat_lower}; CPU eviction stays off"
            )
        sat_lower = sat_upper = None
    policy = _typed(sec, SLO.CPU_EVICT_POLICY, str, base.cpu_evict_policy, problems)
    if policy not in keys.CPU_EVICT_POLICIES:
        if problems is not None:
            problems.append(
                f"NodeSLO {SLO.CPU_EVICT_POLICY}={policy[:64]!r} is unknown; using {base.cpu_evict_policy!r}"
            )
        policy = base.cpu_evict_policy
    return Eviction(
        enable=_typed(sec, SLO.ENABLE, bool, base.enable, problems),
        memory_evict_threshold_percent=threshold,
        memory_evict_lower_percent=default_lower if lower is None else lower,
        cpu_evict_be_satisfaction_lower_percent=sat_lower,
        cpu_evict_be_satisfaction_upper_percent=sat_upper,
        cpu_evict_be_usage_threshold_percent=_ranged(
            _typed(sec, SLO.CPU_EVICT_BE_USAGE_THRESHOLD_PERCENT, int, base.cpu_evict_be_usage_threshold_percent,
                   problems),
            0, 100, base.cpu_evict_be_usage_threshold_percent, SLO.CPU_EVICT_BE_USAGE_THRESHOLD_PERCENT, problems,
        ),
        cpu_evict_time_window_seconds=_optional_int(
            sec, SLO.CPU_EVICT_TIME_WINDOW_SECONDS, 1, MAX_CPU_EVICT_WINDOW_SECONDS, problems
        ),
        cpu_evict_policy=policy,
        evict_enabled_priority_threshold=_optional_int(
            sec, SLO.EVICT_ENABLED_PRIORITY_THRESHOLD, -(2**31), 2**31 - 1, problems
        ),
    )
