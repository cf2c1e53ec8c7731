"""koord_formats.cpunormalization: cpu-basic-info and cpu-normalization-config parsed as
Koordinator's types decode them, and the ratio chosen as koord-manager's CPUNormalization plugin
chooses it (apis/extension/cpu_normalization.go, pkg/slo-controller/noderesource/plugins/
cpunormalization/plugin.go and configmap_event_handler.go)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from koord_formats import FormatError
from koord_formats.cpunormalization import (
    DISABLED_RATIO,
    CPUBasicInfo,
    decide_ratio,
    format_cpu_basic_info,
    parse_cpu_basic_info,
    parse_cpu_normalization_config,
    parse_enabled_label,
)
from tests.formats.hostile import HOLE, call_total, fill, fragments

MODEL = "Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz"
RATIOS = {"baseRatio": 1.5, "hyperThreadEnabledRatio": 1.2, "turboEnabledRatio": 1.8,
          "hyperThreadTurboEnabledRatio": 1.44}


def config(**fields: Any) -> str:
    return json.dumps({"enable": True, "ratioModel": {MODEL: RATIOS}, **fields})


def info(ht: bool = False, turbo: bool = False, model: str = MODEL) -> CPUBasicInfo:
    return CPUBasicInfo(cpu_model=model, hyper_thread_enabled=ht, turbo_enabled=turbo)


# ---- cpu-basic-info -----------------------------------------------------------------------------


def test_basic_info_round_trips_in_go_json_form() -> None:
    full = CPUBasicInfo(MODEL, True, True, "7ff", "GenuineIntel")
    text = format_cpu_basic_info(full)
    assert text == ('{"cpuModel":"Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz","hyperThreadEnabled":true,'
                    '"turboEnabled":true,"catL3CbmMask":"7ff","vendorID":"GenuineIntel"}')
    assert parse_cpu_basic_info(text) == full
    assert format_cpu_basic_info(CPUBasicInfo()) == "{}", "false and empty fields are left out (omitempty)"
    assert format_cpu_basic_info(CPUBasicInfo("a<b>&c")) == '{"cpuModel":"a\\u003cb\\u003e\\u0026c"}', \
        "Go escapes HTML characters"
    assert parse_cpu_basic_info(format_cpu_basic_info(CPUBasicInfo("a<b>&c\u2028"))).cpu_model == "a<b>&c\u2028"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param('{"cpuModel":"X","hyperThreadEnabled":true}', info(True, model="X"), id="Koordinator's example"),
        pytest.param('{"cpuModel":"X","unknown":[1,2]}', info(model="X"), id="unknown fields ignored"),
        pytest.param("null", CPUBasicInfo(), id="null is the empty info, as Go decodes it"),
        pytest.param('{"turboEnabled":null}', CPUBasicInfo(), id="a null field is unset"),
    ],
)
def test_basic_info_parses(text: str, want: CPUBasicInfo) -> None:
    assert parse_cpu_basic_info(text) == want


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"hyperThreadEnabled":"true"}', id="a bool as a string"),
        pytest.param('{"cpuModel":5}', id="a model that is no string"),
        pytest.param('{"cpuModel":"' + "x" * 300 + '"}', id="a model longer than 256"),
        pytest.param("[]", id="a list"),
        pytest.param('{"cpuModel":"x"', id="cut short"),
        pytest.param('{"a":' + '{"a":' * 3 + "1}}}}", id="nested deeper than the format"),
        pytest.param(" " * 5000 + "{}", id="longer than 4 KiB"),
        pytest.param(b"{}", id="bytes"),
    ],
)
def test_basic_info_refuses(text: object) -> None:
    with pytest.raises(FormatError):
        parse_cpu_basic_info(text)


# ---- cpu-normalization-config -------------------------------------------------------------------


def test_absent_config_is_disabled() -> None:
    for text in (None, ""):
        cfg, problems = parse_cpu_normalization_config(text)
        assert cfg.cluster.enable is False and not cfg.cluster.ratio_model and not problems


def test_node_configs_merge_onto_the_cluster_strategy_by_selector() -> None:
    text = json.dumps({
        "enable": False, "defaultRatio": 1.1,
        "ratioModel": {MODEL: RATIOS, "Other": {"baseRatio": 2.0}},
        "nodeConfigs": [
            {"name": "a", "nodeSelector": {"matchLabels": {"pool": "a"}}, "enable": True,
             "ratioModel": {MODEL: {"baseRatio": 3.0}}},
            {"name": "b", "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}},
            {"name": "no selector", "enable": True},
            {"name": "bad selector", "nodeSelector": {"matchExpressions": [{"key": "k", "operator": "Near"}]}},
        ],
    })
    cfg, problems = parse_cpu_normalization_config(text)
    assert len(problems) == 2, "the entries without a (valid) selector match no node"
    a = cfg.for_node({"pool": "a"})
    assert a.enable is True and a.default_ratio == 1.1
    assert a.ratio_model[MODEL].base == 3.0 and a.ratio_model[MODEL].hyper_thread is None, \
        "a model given in the entry replaces the cluster's whole"
    assert a.ratio_model["Other"].base == 2.0, "models merge by name"
    assert cfg.for_node({"pool": "b"}).enable is False, "first match in list order, merged with the cluster's"
    assert cfg.for_node({}) == cfg.cluster


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('{"enable":"true"}', id="enable as a string"),
        pytest.param('{"ratioModel":{"X":{"baseRatio":"1.5"}}}', id="a ratio as a string"),
        pytest.param('{"ratioModel":{"X":{"baseRatio":true}}}', id="a ratio as a bool"),
        pytest.param('{"ratioModel":{"X":{"baseRatio":1e400}}}', id="a ratio past a float"),
        pytest.param('{"ratioModel":[1]}', id="models as a list"),
        pytest.param('{"nodeConfigs":{}}', id="node configs as an object"),
        pytest.param('{"nodeConfigs":[5]}', id="a node config that is no object"),
        pytest.param('{"ratioModel":{' + ",".join(f'"m{i}":{{}}' for i in range(1025)) + "}}", id="1,025 models"),
        pytest.param('{"nodeConfigs":[' + ",".join(["{}"] * 257) + "]}", id="257 node configs"),
        pytest.param("[]", id="a list"),
    ],
)
def test_config_refuses(text: str) -> None:
    with pytest.raises(FormatError):
        parse_cpu_normalization_config(text)


# ---- the ratio choice (plugin.go Calculate) ------------------------------------------------------

CFG, _ = parse_cpu_normalization_config(config())
OFF, _ = parse_cpu_normalization_config(config(enable=False))
UNSET, _ = parse_cpu_normalization_config(json.dumps({"ratioModel": {MODEL: RATIOS}}))
PARTIAL, _ = parse_cpu_normalization_config(json.dumps({"enable": True, "ratioModel": {MODEL: {"baseRatio": 1.5}}}))
EDGES, _ = parse_cpu_normalization_config(json.dumps({"enable": True, "ratioModel": {
    "low": {"baseRatio": 0.99}, "high": {"baseRatio": 5.01}, "one": {"baseRatio": 1},
    "five": {"baseRatio": 5}, "round": {"baseRatio": 3.14159}, "tie": {"baseRatio": 1.005},
    "near5": {"baseRatio": 4.999}}}))

RATIO_TABLE = [
    # (strategy, enabled label, info, ratio written or None = left as it is)
    pytest.param(CFG, None, info(), "1.50", id="HT off, turbo off: baseRatio"),
    pytest.param(CFG, None, info(ht=True), "1.20", id="HT on, turbo off: hyperThreadEnabledRatio"),
    pytest.param(CFG, None, info(turbo=True), "1.80", id="HT off, turbo on: turboEnabledRatio"),
    pytest.param(CFG, None, info(True, True), "1.44", id="HT on, turbo on: hyperThreadTurboEnabledRatio"),
    pytest.param(OFF, None, info(), DISABLED_RATIO, id="disabled by config: 1.00, never removed"),
    pytest.param(UNSET, None, info(), DISABLED_RATIO, id="enable unset: disabled"),
    pytest.param(OFF, "true", info(), "1.50", id="the label enables over the config"),
    pytest.param(CFG, "false", info(), DISABLED_RATIO, id="the label disables over the config"),
    pytest.param(OFF, "T", info(), "1.50", id="the label in another ParseBool spelling"),
    pytest.param(CFG, "yes", info(), None, id="a label that is no ParseBool boolean: left as it is"),
    pytest.param(OFF, "yes", info(), None, id="a bad label leaves it even when disabled"),
    pytest.param(CFG, None, None, None, id="no cpu-basic-info: left as it is"),
    pytest.param(CFG, None, "unreadable", None, id="unreadable cpu-basic-info: left as it is"),
    pytest.param(OFF, None, None, DISABLED_RATIO, id="disabled needs no cpu-basic-info"),
    pytest.param(CFG, None, info(model="Unknown CPU"), None, id="a model the config does not name: left as it is"),
    pytest.param(PARTIAL, None, info(ht=True), None, id="no ratio for the combination: left as it is"),
    pytest.param(PARTIAL, None, info(), "1.50", id="the combination that is given"),
    pytest.param(EDGES, None, info(model="low"), None, id="below 1.0: left as it is"),
    pytest.param(EDGES, None, info(model="high"), None, id="above 5.0: left as it is"),
    pytest.param(EDGES, None, info(model="one"), "1.00", id="1 (an integer) is in range"),
    pytest.param(EDGES, None, info(model="five"), "5.00", id="5 is in range"),
    pytest.param(EDGES, None, info(model="round"), "3.14", id="two decimals"),
    pytest.param(EDGES, None, info(model="tie"), "1.00", id="rounded from the binary value, as Go (1.005 < 1.005)"),
    pytest.param(EDGES, None, info(model="near5"), "5.00", id="checked before rounding"),
]


@pytest.mark.parametrize(("strategy", "label", "basic", "want"), RATIO_TABLE)
def test_the_ratio_is_chosen_as_koord_manager_chooses_it(strategy: Any, label: str | None, basic: Any,
                                                         want: str | None) -> None:
    assert decide_ratio(strategy.cluster, label, basic).ratio == want


def test_the_node_strategy_chooses_for_its_nodes() -> None:
    cfg, _ = parse_cpu_normalization_config(config(enable=False, nodeConfigs=[
        {"name": "x", "nodeSelector": {"matchLabels": {"norm": "on"}}, "enable": True}]))
    assert decide_ratio(cfg.for_node({"norm": "on"}), None, info()).ratio == "1.50"
    assert decide_ratio(cfg.for_node({}), None, info()).ratio == DISABLED_RATIO


@pytest.mark.parametrize(("text", "want"), [("1", True), ("TRUE", True), ("f", False), ("False", False), (None, None)])
def test_the_enabled_label_is_go_parse_bool(text: str | None, want: bool | None) -> None:
    assert parse_enabled_label(text) is want


@pytest.mark.parametrize("text", ["yes", "on", " true", "tRuE", "", "1" * 100])
def test_the_enabled_label_refuses_other_spellings(text: str) -> None:
    with pytest.raises(FormatError):
        parse_enabled_label(text)


# ---- hostile: every hole of both formats ---------------------------------------------------------

BASIC_TEMPLATES = [HOLE, '{"cpuModel":HOLE}', '{"hyperThreadEnabled":HOLE}', '{"vendorID":HOLE,"x":HOLE}']
CONFIG_TEMPLATES = [
    HOLE, '{"enable":HOLE}', '{"defaultRatio":HOLE}', '{"ratioModel":HOLE}', '{"ratioModel":{"m":HOLE}}',
    '{"ratioModel":{"m":{"baseRatio":HOLE}}}', '{"nodeConfigs":HOLE}', '{"nodeConfigs":[HOLE]}',
    '{"nodeConfigs":[{"nodeSelector":HOLE,"enable":true}]}', '{"nodeConfigs":[{"nodeSelector":{},"ratioModel":HOLE}]}',
]


@given(data=st.data(), fragment=fragments)
def test_hostile_basic_info_is_a_format_error(data: st.DataObject, fragment: str) -> None:
    result = call_total(parse_cpu_basic_info, fill(data.draw(st.sampled_from(BASIC_TEMPLATES)), fragment))
    assert result is None or isinstance(result, CPUBasicInfo)


@given(data=st.data(), fragment=fragments)
def test_hostile_config_is_a_format_error_and_a_ratio_is_always_in_range(data: st.DataObject, fragment: str) -> None:
    result = call_total(parse_cpu_normalization_config, fill(data.draw(st.sampled_from(CONFIG_TEMPLATES)), fragment))
    if result is None:
        return
    cfg, _ = result
    for strategy in (cfg.cluster, *(s for _, s in cfg.nodes)):
        for model in list(strategy.ratio_model)[:4]:
            for ht in (False, True):
                for turbo in (False, True):
                    ratio = decide_ratio(strategy, "true", info(ht, turbo, model)).ratio
                    assert ratio is None or 1.0 <= float(ratio) <= 5.0
