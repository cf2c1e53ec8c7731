"""slo-controller-config's NodeSLO keys, and the NodeSLO ``spec`` they give each node.

Sources (koordinator-sh/koordinator): ``apis/configuration/slo_controller_config.go`` (keys,
``{clusterStrategy, nodeStrategies[{name, nodeSelector, ...}]}``), ``pkg/util/sloconfig/
nodeslo_config.go`` (defaults), ``pkg/slo-controller/nodeslo/`` (rendering).

Keys and the NodeSLO spec field each one fills:

- ``resource-threshold-config`` -> ``resourceUsedThresholdWithBE``
- ``resource-qos-config`` -> ``resourceQOSStrategy`` (its base is an empty object, not the
  per-class defaults: koordlet fills those)
- ``cpu-burst-config`` -> ``cpuBurstStrategy``
- ``system-config`` -> ``systemStrategy``
- ``host-application-config`` -> ``hostApplications``: ``{applications, nodeConfigs[{name,
  nodeSelector, applications}]}``; the first matching entry's list replaces the cluster's.

Per key: cluster = default ⊕ ``clusterStrategy``; a node gets cluster ⊕ the first
``nodeStrategies`` entry (list order) whose ``nodeSelector`` matches its labels, else the cluster
strategy. An entry without a selector or with an invalid one matches no node; an entry whose
merged strategy does not validate stands for the cluster strategy. A key that is absent (or the
ConfigMap missing) gives the default; a key whose text is not bounded JSON of the right shape,
or whose cluster strategy does not validate (``koord_formats.nodeslo.validate_node_slo``), keeps
its previous value (the default when there is none) and is reported, as koord-manager keeps the
previous value and records ``SLOCfgUnmarshalFailed``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koord_formats import nodeslo
from koord_formats.bounded import load_json, read_list, read_object, read_str
from koord_formats.colocation import MAX_CONFIG_CHARS, overlay
from koord_formats.errors import FormatError
from koord_formats.keys import SLO
from koord_formats.selector import LabelSelector, parse_label_selector

__all__ = [
    "CONFIG_KEY_CPU_BURST",
    "CONFIG_KEY_HOST_APPLICATION",
    "CONFIG_KEY_RESOURCE_QOS",
    "CONFIG_KEY_RESOURCE_THRESHOLD",
    "CONFIG_KEY_SYSTEM",
    "NODESLO_API_GROUP",
    "NODESLO_API_VERSION",
    "NODESLO_KIND",
    "NODESLO_PLURAL",
    "STRATEGY_KEYS",
    "SYSTEM_STRATEGY",
    "HostAppConfig",
    "SLOConfig",
    "StrategyConfig",
    "default_strategy",
    "parse_slo_config",
    "render_node_slo",
]

# The NodeSLO kind: cluster-scoped, one per node named like it (apis/slo/v1alpha1/nodeslo_types.go).
NODESLO_API_GROUP = "slo.koordinator.sh"
NODESLO_API_VERSION = "v1alpha1"
NODESLO_KIND = "NodeSLO"
NODESLO_PLURAL = "nodeslos"
CONFIG_KEY_RESOURCE_THRESHOLD = "resource-threshold-config"
CONFIG_KEY_RESOURCE_QOS = "resource-qos-config"
CONFIG_KEY_CPU_BURST = "cpu-burst-config"
CONFIG_KEY_SYSTEM = "system-config"
CONFIG_KEY_HOST_APPLICATION = "host-application-config"
SYSTEM_STRATEGY = "systemStrategy"

# ConfigMap key -> the NodeSLO spec field it fills.
STRATEGY_KEYS: Mapping[str, str] = MappingProxyType(
    {
        CONFIG_KEY_RESOURCE_THRESHOLD: SLO.RESOURCE_USED_THRESHOLD_WITH_BE,
        CONFIG_KEY_RESOURCE_QOS: SLO.RESOURCE_QOS_STRATEGY,
        CONFIG_KEY_CPU_BURST: SLO.CPU_BURST_STRATEGY,
        CONFIG_KEY_SYSTEM: SYSTEM_STRATEGY,
    }
)

_CLUSTER = "clusterStrategy"
_NODES = "nodeStrategies"
_APPLICATIONS = "applications"
_NODE_CONFIGS = "nodeConfigs"
_NAME = "name"
_NODE_SELECTOR = "nodeSelector"
_MAX_NODE_STRATEGIES = 256
_MAX_APPLICATIONS = 256


def default_strategy(spec_field: str) -> dict[str, Any]:
    """The default of one NodeSLO strategy (a fresh document)."""
    if spec_field == SLO.RESOURCE_USED_THRESHOLD_WITH_BE:
        return {
            SLO.ENABLE: False,
            SLO.CPU_SUPPRESS_THRESHOLD_PERCENT: 65,
            SLO.CPU_SUPPRESS_POLICY: "cpuset",
            SLO.MEMORY_EVICT_THRESHOLD_PERCENT: 70,
            SLO.CPU_EVICT_POLICY: "evictByRealLimit",
        }
    if spec_field == SLO.CPU_BURST_STRATEGY:
        return {
            SLO.POLICY: "none",
            SLO.CPU_BURST_PERCENT: 1000,
            SLO.CFS_QUOTA_BURST_PERCENT: 300,
            SLO.CFS_QUOTA_BURST_PERIOD_SECONDS: -1,
            SLO.SHARE_POOL_THRESHOLD_PERCENT: 50,
        }
    if spec_field == SYSTEM_STRATEGY:
        return {
            "minFreeKbytesFactor": 100,
            "watermarkScaleFactor": 150,
            "memcgReapBackGround": 0,
            "totalNetworkBandwidth": "0",
        }
    return {}  # resourceQOSStrategy: an empty object


@dataclass(frozen=True, slots=True)
class StrategyConfig:
    """One strategy key: the cluster document and the node entries (selector, merged document)."""

    cluster: Mapping[str, Any]
    nodes: tuple[tuple[LabelSelector, Mapping[str, Any]], ...] = ()

    def for_node(self, labels: Mapping[str, str]) -> Mapping[str, Any]:
        for selector, doc in self.nodes:
            if selector.matches(labels):
                return doc
        return self.cluster


@dataclass(frozen=True, slots=True)
class HostAppConfig:
    """``host-application-config``: the cluster list and the node entries' lists (raw entries,
    each checked by ``koord_formats.nodeslo.host_application``)."""

    applications: tuple[Mapping[str, Any], ...] = ()
    nodes: tuple[tuple[LabelSelector, tuple[Mapping[str, Any], ...]], ...] = ()

    def for_node(self, labels: Mapping[str, str]) -> tuple[Mapping[str, Any], ...]:
        for selector, apps in self.nodes:
            if selector.matches(labels):
                return apps
        return self.applications


def _defaults() -> dict[str, StrategyConfig]:
    return {f: StrategyConfig(MappingProxyType(default_strategy(f))) for f in STRATEGY_KEYS.values()}


@dataclass(frozen=True, slots=True)
class SLOConfig:
    """Every NodeSLO key of the ConfigMap, parsed (``parse_slo_config``)."""

    strategies: Mapping[str, StrategyConfig] = field(default_factory=lambda: MappingProxyType(_defaults()))
    host_apps: HostAppConfig = HostAppConfig()


def _check(spec_field: str, doc: Mapping[str, Any], what: str) -> None:
    if spec_field != SYSTEM_STRATEGY:
        try:
            nodeslo.validate_node_slo({spec_field: doc})
        except FormatError as exc:
            raise FormatError(f"{what}: {exc}") from None


def _selector(entry: Mapping[str, Any], what: str) -> LabelSelector | None:
    raw = entry.get(_NODE_SELECTOR)
    if raw is None:
        return None  # a nil selector matches no node
    try:
        return parse_label_selector(raw, f"{what} {_NODE_SELECTOR}")
    except FormatError:
        return None


def _node_entries(
    value: object, what: str, problems: list[str]
) -> Iterator[tuple[str, Mapping[str, Any], LabelSelector]]:
    """The per-node entries of a config key (at most ``_MAX_NODE_STRATEGIES`` objects), each
    as (its name in messages, the entry, its node selector); an entry without a valid selector
    is a problem and left out."""
    for i, raw in enumerate(read_list([] if value is None else value, what, _MAX_NODE_STRATEGIES)):
        entry_what = f"{what}[{i}]"
        entry = read_object(raw, entry_what)
        selector = _selector(entry, entry_what)
        if selector is None:
            problems.append(f"{entry_what}: no valid {_NODE_SELECTOR}; it matches no node")
            continue
        yield entry_what, entry, selector


def _strategy_key(key: str, spec_field: str, text: str, problems: list[str]) -> StrategyConfig:
    doc = read_object(load_json(text, key, max_chars=MAX_CONFIG_CHARS), key)
    raw_cluster = doc.get(_CLUSTER)
    cluster = overlay(
        default_strategy(spec_field),
        {} if raw_cluster is None else read_object(raw_cluster, f"{key} {_CLUSTER}"),
    )
    _check(spec_field, cluster, f"{key} {_CLUSTER}")
    nodes: list[tuple[LabelSelector, Mapping[str, Any]]] = []
    for what, entry, selector in _node_entries(doc.get(_NODES), f"{key} {_NODES}", problems):
        merged = overlay(cluster, {k: v for k, v in entry.items() if k not in (_NAME, _NODE_SELECTOR)})
        try:
            _check(spec_field, merged, what)
        except FormatError as exc:
            problems.append(f"{exc}; its nodes get the cluster strategy")
            merged = cluster
        nodes.append((selector, MappingProxyType(merged)))
    return StrategyConfig(MappingProxyType(cluster), tuple(nodes))


def _apps(value: object, what: str) -> tuple[Mapping[str, Any], ...]:
    apps = read_list([] if value is None else value, what, _MAX_APPLICATIONS)
    for app in apps:
        nodeslo.host_application(app)
        read_str(read_object(app, what).get(_NAME), f"{what} {_NAME}")
    return tuple(MappingProxyType(dict(a)) for a in apps)


def _host_apps(text: str, problems: list[str]) -> HostAppConfig:
    key = CONFIG_KEY_HOST_APPLICATION
    doc = read_object(load_json(text, key, max_chars=MAX_CONFIG_CHARS), key)
    cluster = _apps(doc.get(_APPLICATIONS), f"{key} {_APPLICATIONS}")
    nodes: list[tuple[LabelSelector, tuple[Mapping[str, Any], ...]]] = []
    for what, entry, selector in _node_entries(doc.get(_NODE_CONFIGS), f"{key} {_NODE_CONFIGS}", problems):
        try:
            nodes.append((selector, _apps(entry.get(_APPLICATIONS), f"{what} {_APPLICATIONS}")))
        except FormatError as exc:
            problems.append(f"{exc}; entry left out")
    return HostAppConfig(cluster, tuple(nodes))


def parse_slo_config(
    data: Mapping[str, object] | None, previous: SLOConfig | None = None
) -> tuple[SLOConfig, tuple[str, ...]]:
    """The ConfigMap's ``data`` (None when the ConfigMap is missing) as an ``SLOConfig``, and
    the problems found. Never raises: a bad key keeps its ``previous`` value (the default
    without one) and costs only that key."""
    data = data or {}
    base = previous or SLOConfig()
    problems: list[str] = []
    strategies = dict(base.strategies)
    for key, spec_field in STRATEGY_KEYS.items():
        text = data.get(key)
        if text is None or text == "":
            strategies[spec_field] = StrategyConfig(MappingProxyType(default_strategy(spec_field)))
            continue
        try:
            if not isinstance(text, str):
                raise FormatError(f"{key}: expected a string")
            strategies[spec_field] = _strategy_key(key, spec_field, text, problems)
        except FormatError as exc:
            problems.append(f"{exc}; the previous value is kept")
    host_apps = base.host_apps
    text = data.get(CONFIG_KEY_HOST_APPLICATION)
    if text is None or text == "":
        host_apps = HostAppConfig()
    else:
        try:
            if not isinstance(text, str):
                raise FormatError(f"{CONFIG_KEY_HOST_APPLICATION}: expected a string")
            host_apps = _host_apps(text, problems)
        except FormatError as exc:
            problems.append(f"{exc}; the previous value is kept")
    return SLOConfig(MappingProxyType(strategies), host_apps), tuple(problems)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def render_node_slo(cfg: SLOConfig, labels: Mapping[str, str]) -> dict[str, Any]:
    """The NodeSLO ``spec`` for a node with ``labels`` (plain JSON-ready values)."""
    spec: dict[str, Any] = {f: _plain(s.for_node(labels)) for f, s in cfg.strategies.items()}
    apps = cfg.host_apps.for_node(labels)
    if apps:
        spec[SLO.HOST_APPLICATIONS] = _plain(apps)
    return spec
