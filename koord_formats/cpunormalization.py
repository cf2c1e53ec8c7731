"""CPU normalization's two inputs and the ratio chosen from them: the node's
``node.koordinator.sh/cpu-basic-info`` (a NodeResourceTopology annotation the node reports) and
the ``cpu-normalization-config`` key of slo-controller-config (which the manager reads).

Sources (koordinator-sh/koordinator): ``apis/extension/cpu_normalization.go`` (``CPUBasicInfo``,
the ratio annotation, the ``cpu-normalization-enabled`` label), ``apis/configuration/
slo_controller_config.go`` (``CPUNormalizationCfg``), ``pkg/slo-controller/noderesource/plugins/
cpunormalization/`` (``plugin.go``: the choice; ``configmap_event_handler.go``: defaults, merge,
node selectors).

cpu-basic-info: a JSON object ``{"cpuModel", "hyperThreadEnabled", "turboEnabled",
"catL3CbmMask", "vendorID"}``, every field optional (``omitempty``: false and "" are left out),
unknown fields ignored. ``format_cpu_basic_info`` writes it as Go's ``json.Marshal`` does.

cpu-normalization-config: ``{"enable", "defaultRatio", "ratioModel": {<CPU model>:
{"baseRatio", "hyperThreadEnabledRatio", "turboEnabledRatio", "hyperThreadTurboEnabledRatio"}},
"nodeConfigs": [{"name", "nodeSelector", <the same fields>}]}``. The cluster strategy is the
default (``enable: false``, no models) overlaid with the top-level fields; each node entry is the
cluster strategy overlaid with the entry (a field given wins; ``ratioModel`` merges by model, a
model given replaces the cluster's entry for it whole). A node gets the first entry, in list
order, whose selector matches its labels, else the cluster strategy; an entry without a selector,
or with an invalid one, matches no node. ``defaultRatio`` is read but chooses nothing: Koordinator's
plugin never uses it.

The ratio of a node (``decide_ratio``), as the manager's plugin chooses it:

- the label ``node.koordinator.sh/cpu-normalization-enabled`` (Go's ``strconv.ParseBool``
  spellings) wins over the strategy's ``enable``; unset and unset means disabled;
- disabled: ``"1.00"`` (Koordinator writes that; it never removes the annotation);
- enabled: the model entry of the node's ``cpuModel``, then by hyper-threading and turbo: both
  on ``hyperThreadTurboEnabledRatio``, hyper-threading only ``hyperThreadEnabledRatio``, turbo
  only ``turboEnabledRatio``, neither ``baseRatio``; it must lie in [1.0, 5.0] and is written
  with two decimals (Go's ``FormatFloat(r, 'f', 2)``);
- a label that is not a boolean, no cpu-basic-info (or an unreadable one), a model the config
  does not name, a missing ratio for the node's combination or one outside the range: the
  annotation is left as it is (Koordinator's plugin returns an error and writes nothing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from koord_formats.bounded import load_json, read_bool, read_list, read_object, read_str
from koord_formats.errors import FormatError
from koord_formats.selector import LabelSelector, parse_label_selector

__all__ = [
    "CONFIG_KEY_CPU_NORMALIZATION",
    "DISABLED_RATIO",
    "MAX_BASIC_INFO_CHARS",
    "MAX_CONFIG_CHARS",
    "MAX_RATIO",
    "MIN_RATIO",
    "CPUBasicInfo",
    "CPUNormalizationConfig",
    "ModelRatio",
    "RatioDecision",
    "Strategy",
    "decide_ratio",
    "format_cpu_basic_info",
    "format_ratio",
    "model_ratio",
    "parse_cpu_basic_info",
    "parse_cpu_normalization_config",
    "parse_enabled_label",
]

CONFIG_KEY_CPU_NORMALIZATION = "cpu-normalization-config"
DISABLED_RATIO = "1.00"
MIN_RATIO = 1.0
MAX_RATIO = 5.0
MAX_BASIC_INFO_CHARS = 4096
MAX_CONFIG_CHARS = 512 * 1024
_MAX_MODEL_CHARS = 256  # /proc/cpuinfo's "model name" is at most 48 characters on x86
_MAX_SHORT_CHARS = 64
_MAX_MODELS = 1024
_MAX_NODE_CONFIGS = 256

_CPU_MODEL, _HT, _TURBO, _CBM, _VENDOR = "cpuModel", "hyperThreadEnabled", "turboEnabled", "catL3CbmMask", "vendorID"
_ENABLE, _DEFAULT_RATIO, _RATIO_MODEL, _NODE_CONFIGS = "enable", "defaultRatio", "ratioModel", "nodeConfigs"
_NAME, _NODE_SELECTOR = "name", "nodeSelector"
_BASE, _HT_RATIO, _TURBO_RATIO, _HT_TURBO_RATIO = (
    "baseRatio", "hyperThreadEnabledRatio", "turboEnabledRatio", "hyperThreadTurboEnabledRatio")
# Go's strconv.ParseBool.
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


# ---- cpu-basic-info ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CPUBasicInfo:
    """The node's ``cpu-basic-info``."""

    cpu_model: str = ""
    hyper_thread_enabled: bool = False
    turbo_enabled: bool = False
    cat_l3_cbm_mask: str = ""
    vendor_id: str = ""


def _opt_str(doc: Mapping[str, Any], key: str, what: str, max_chars: int) -> str:
    value = doc.get(key)
    return "" if value is None else read_str(value, f"{what} {key}", max_chars)


def _opt_bool(doc: Mapping[str, Any], key: str, what: str) -> bool:
    value = doc.get(key)
    return False if value is None else read_bool(value, f"{what} {key}")


def parse_cpu_basic_info(text: object) -> CPUBasicInfo:
    """Parse ``node.koordinator.sh/cpu-basic-info`` (at most ``MAX_BASIC_INFO_CHARS``); JSON
    ``null`` is the empty info, as Go decodes it. ``FormatError`` for anything else that is not
    an object of these fields with these types."""
    what = "cpu-basic-info"
    doc = load_json(text, what, max_chars=MAX_BASIC_INFO_CHARS, max_depth=2)
    if doc is None:
        return CPUBasicInfo()
    doc = read_object(doc, what)
    return CPUBasicInfo(
        cpu_model=_opt_str(doc, _CPU_MODEL, what, _MAX_MODEL_CHARS),
        hyper_thread_enabled=_opt_bool(doc, _HT, what),
        turbo_enabled=_opt_bool(doc, _TURBO, what),
        cat_l3_cbm_mask=_opt_str(doc, _CBM, what, _MAX_SHORT_CHARS),
        vendor_id=_opt_str(doc, _VENDOR, what, _MAX_SHORT_CHARS),
    )


def _go_json_string(text: str) -> str:
    """A JSON string as Go's encoder writes it: UTF-8 kept, ``<``, ``>``, ``&``, U+2028 and
    U+2029 escaped."""
    out = json.dumps(text, ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        out = out.replace(ch, esc)
    return out


def format_cpu_basic_info(info: CPUBasicInfo) -> str:
    """The annotation text: fields in Koordinator's order, false and empty ones left out."""
    parts: list[str] = []
    if info.cpu_model:
        parts.append(f'"{_CPU_MODEL}":{_go_json_string(info.cpu_model)}')
    if info.hyper_thread_enabled:
        parts.append(f'"{_HT}":true')
    if info.turbo_enabled:
        parts.append(f'"{_TURBO}":true')
    if info.cat_l3_cbm_mask:
        parts.append(f'"{_CBM}":{_go_json_string(info.cat_l3_cbm_mask)}')
    if info.vendor_id:
        parts.append(f'"{_VENDOR}":{_go_json_string(info.vendor_id)}')
    return "{" + ",".join(parts) + "}"


# ---- cpu-normalization-config ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelRatio:
    """One CPU model's ratios (``None``: not given)."""

    base: float | None = None
    hyper_thread: float | None = None
    turbo: float | None = None
    hyper_thread_turbo: float | None = None


@dataclass(frozen=True, slots=True)
class Strategy:
    """A ``CPUNormalizationStrategy`` (``None``: not given)."""

    enable: bool | None = None
    default_ratio: float | None = None
    ratio_model: Mapping[str, ModelRatio] = field(default_factory=lambda: MappingProxyType({}))

    def overlay(self, top: Strategy) -> Strategy:
        """``self`` with what ``top`` gives (Koordinator's ``MergeCfg``)."""
        return Strategy(
            enable=self.enable if top.enable is None else top.enable,
            default_ratio=self.default_ratio if top.default_ratio is None else top.default_ratio,
            ratio_model=MappingProxyType({**self.ratio_model, **top.ratio_model}),
        )


_DEFAULT = Strategy(enable=False)


@dataclass(frozen=True, slots=True)
class CPUNormalizationConfig:
    """The parsed config: the cluster strategy and the node entries (selector, merged strategy)."""

    cluster: Strategy = _DEFAULT
    nodes: tuple[tuple[LabelSelector, Strategy], ...] = ()

    def for_node(self, labels: Mapping[str, str]) -> Strategy:
        for selector, strategy in self.nodes:
            if selector.matches(labels):
                return strategy
        return self.cluster


def _ratio(value: object, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FormatError(f"{what}: expected a number, got {type(value).__name__}")
    return float(value)


def _model_ratio(value: object, what: str) -> ModelRatio:
    if value is None:
        return ModelRatio()
    doc = read_object(value, what)
    return ModelRatio(
        base=_ratio(doc.get(_BASE), f"{what} {_BASE}"),
        hyper_thread=_ratio(doc.get(_HT_RATIO), f"{what} {_HT_RATIO}"),
        turbo=_ratio(doc.get(_TURBO_RATIO), f"{what} {_TURBO_RATIO}"),
        hyper_thread_turbo=_ratio(doc.get(_HT_TURBO_RATIO), f"{what} {_HT_TURBO_RATIO}"),
    )


def _strategy(doc: Mapping[str, Any], what: str) -> Strategy:
    enable = doc.get(_ENABLE)
    raw_models = doc.get(_RATIO_MODEL)
    models: dict[str, ModelRatio] = {}
    if raw_models is not None:
        items = read_object(raw_models, f"{what} {_RATIO_MODEL}")
        if len(items) > _MAX_MODELS:
            raise FormatError(f"{what} {_RATIO_MODEL}: {len(items)} models, more than the {_MAX_MODELS} allowed")
        for name, value in items.items():
            model = read_str(name, f"{what} {_RATIO_MODEL} key", _MAX_MODEL_CHARS)
            models[model] = _model_ratio(value, f"{what} {_RATIO_MODEL}[{model[:64]!r}]")
    return Strategy(
        enable=None if enable is None else read_bool(enable, f"{what} {_ENABLE}"),
        default_ratio=_ratio(doc.get(_DEFAULT_RATIO), f"{what} {_DEFAULT_RATIO}"),
        ratio_model=MappingProxyType(models),
    )


def parse_cpu_normalization_config(text: object) -> tuple[CPUNormalizationConfig, tuple[str, ...]]:
    """The ``cpu-normalization-config`` text (``None`` or ``""``: the key is absent, the default,
    disabled) and the problems found in entries that were left out. ``FormatError`` when the
    text is not bounded JSON of this shape; the caller then keeps its previous config, as
    Koordinator does."""
    if text is None or text == "":
        return CPUNormalizationConfig(), ()
    key = CONFIG_KEY_CPU_NORMALIZATION
    doc = read_object(load_json(text, key, max_chars=MAX_CONFIG_CHARS), key)
    cluster = _DEFAULT.overlay(_strategy(doc, key))
    raw_nodes = doc.get(_NODE_CONFIGS)
    nodes: list[tuple[LabelSelector, Strategy]] = []
    problems: list[str] = []
    for i, raw in enumerate(read_list([] if raw_nodes is None else raw_nodes, f"{key} {_NODE_CONFIGS}",
                                      _MAX_NODE_CONFIGS)):
        what = f"{key} {_NODE_CONFIGS}[{i}]"
        entry = read_object(raw, what)
        name = entry.get(_NAME)
        if name is not None:
            read_str(name, f"{what} {_NAME}")
        strategy = cluster.overlay(_strategy(entry, what))
        raw_selector = entry.get(_NODE_SELECTOR)
        if raw_selector is None:
            problems.append(f"{what}: no {_NODE_SELECTOR}; it matches no node")
            continue
        try:
            selector = parse_label_selector(raw_selector, f"{what} {_NODE_SELECTOR}")
        except FormatError as exc:
            problems.append(f"{exc}; it matches no node")
            continue
        nodes.append((selector, strategy))
    return CPUNormalizationConfig(cluster, tuple(nodes)), tuple(problems)


# ---- the ratio -----------------------------------------------------------------------------------


def parse_enabled_label(text: object) -> bool | None:
    """The ``cpu-normalization-enabled`` label: ``None`` when unset, else Go's ``ParseBool``
    (``FormatError`` for any other spelling)."""
    if text is None:
        return None
    raw = read_str(text, "cpu-normalization-enabled", _MAX_SHORT_CHARS)
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise FormatError(f"cpu-normalization-enabled: {raw!r} is not a boolean")


def model_ratio(info: CPUBasicInfo, strategy: Strategy) -> float:
    """The ratio the strategy's model entry gives this CPU (not range-checked);
    ``FormatError`` when the model or its ratio for this combination is not configured."""
    entry = strategy.ratio_model.get(info.cpu_model)
    if entry is None:
        raise FormatError(f"no ratio for CPU {info.cpu_model[:64]!r}")
    if info.hyper_thread_enabled and info.turbo_enabled:
        value, name = entry.hyper_thread_turbo, _HT_TURBO_RATIO
    elif info.hyper_thread_enabled:
        value, name = entry.hyper_thread, _HT_RATIO
    elif info.turbo_enabled:
        value, name = entry.turbo, _TURBO_RATIO
    else:
        value, name = entry.base, _BASE
    if value is None:
        raise FormatError(f"missing {name} for CPU {info.cpu_model[:64]!r}")
    return value


def format_ratio(ratio: float) -> str:
    """Two decimals, rounded from the exact binary value as Go's ``FormatFloat(r, 'f', 2)``."""
    return f"{ratio:.2f}"


@dataclass(frozen=True, slots=True)
class RatioDecision:
    """What to do with a node's ratio annotation: write ``ratio``, or (``None``) leave it as it
    is; ``reason`` says why."""

    ratio: str | None
    reason: str


def decide_ratio(strategy: Strategy, label: object, info: CPUBasicInfo | str | None) -> RatioDecision:
    """The node's ratio from its strategy (``CPUNormalizationConfig.for_node``), its
    ``cpu-normalization-enabled`` label value (``None`` when unset) and its cpu-basic-info
    (``None`` when absent, a ``str`` saying why when it could not be read)."""
    try:
        enabled = parse_enabled_label(label)
    except FormatError as exc:
        return RatioDecision(None, str(exc))
    if enabled is None:
        enabled = bool(strategy.enable)
    if not enabled:
        return RatioDecision(DISABLED_RATIO, "cpu normalization disabled")
    if info is None:
        return RatioDecision(None, "no cpu-basic-info in the NodeResourceTopology")
    if isinstance(info, str):
        return RatioDecision(None, info)
    try:
        ratio = model_ratio(info, strategy)
    except FormatError as exc:
        return RatioDecision(None, str(exc))
    if not MIN_RATIO <= ratio <= MAX_RATIO:
        return RatioDecision(None, f"ratio {ratio!r} outside [{MIN_RATIO}, {MAX_RATIO}]")
    return RatioDecision(format_ratio(ratio), f"model {info.cpu_model[:64]!r}")
