"""QoS class and priority class resolution."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import keys, qos
from tests.formats.hostile import call_total


@pytest.mark.parametrize(
    ("labels", "kube_qos", "expected"),
    [
        pytest.param({keys.LABEL_QOS_CLASS: "LSE"}, "Burstable", "LSE", id="the label wins over kube QoS"),
        pytest.param({}, "Guaranteed", "LSR", id="Guaranteed without a label is LSR"),
        pytest.param({}, "Burstable", "LS", id="Burstable without a label is LS"),
        pytest.param({}, "BestEffort", "BE", id="BestEffort without a label is BE"),
        pytest.param({keys.LABEL_QOS_CLASS: "GOLD"}, "Burstable", "LS", id="an unknown label falls back"),
        pytest.param({}, "", "", id="nothing known is no class"),
    ],
)
def test_qos_class(labels: dict[str, str], kube_qos: str, expected: str) -> None:
    assert qos.qos_class(labels, kube_qos) == expected


@pytest.mark.parametrize(
    ("labels", "priority", "qos_class", "expected"),
    [
        pytest.param({}, 9500, "LS", "koord-prod", id="a value in the prod range"),
        pytest.param({}, 7000, "LS", "koord-mid", id="the first value of the mid range"),
        pytest.param({}, 5999, "BE", "koord-batch", id="the last value of the batch range"),
        pytest.param({}, 3500, "BE", "koord-free", id="a value in the free range"),
        pytest.param({}, 100, "BE", "koord-batch", id="BE outside every range defaults to batch"),
        pytest.param({}, None, "LSR", "koord-prod", id="no priority defaults to prod"),
        pytest.param({}, True, "LS", "koord-prod", id="a boolean priority is ignored"),
        pytest.param({keys.LABEL_PRIORITY_CLASS: "koord-mid"}, 9500, "LS", "koord-mid", id="the label overrides"),
    ],
)
def test_priority_class(labels: dict[str, str], priority: object, qos_class: str, expected: str) -> None:
    assert qos.priority_class(labels, priority, qos_class) == expected


@settings(max_examples=200, deadline=None)
@given(
    label=st.text(max_size=10) | st.sampled_from(keys.KOORD_QOS_CLASSES),
    priority=st.integers() | st.none() | st.floats() | st.text(max_size=5),
)
def test_resolution_is_total(label: str, priority: object) -> None:
    labels = {keys.LABEL_QOS_CLASS: label, keys.LABEL_PRIORITY_CLASS: label}
    cls = call_total(qos.qos_class, labels, "Burstable")
    assert cls in keys.KOORD_QOS_CLASSES
    assert call_total(qos.priority_class, labels, priority, cls) in keys.PRIORITY_CLASSES
