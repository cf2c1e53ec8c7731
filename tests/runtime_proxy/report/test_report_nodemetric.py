"""runtime_proxy/report/nodemetric.py: the NodeMetric status from samples, as koordlet builds it:
averages over the aggregate window, percentiles per duration with the cold start, system usage,
pods and host applications."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from hooks.facts import PodFacts
from hooks.usage import ResourceUsage, UsageSample
from koord_formats import keys
from koord_formats.nodemetric import CollectPolicy, Usage
from runtime_proxy.report.nodemetric import (
    BUCKET_SECONDS,
    RETENTION_SECONDS,
    HostAppMeta,
    MetricWindow,
    PodMeta,
    percentile,
)

WEB = PodMeta("default", "web", "koord-prod", "LS")
JOB = PodMeta("batch", "job", "koord-batch", "BE")


def _sample(at: float, cpu: int, mem: int, pods: dict[str, tuple[int, int]] | None = None,
            apps: dict[str, tuple[int, int]] | None = None) -> UsageSample:
    return UsageSample(
        at=at, node_cpu_milli=cpu, node_memory_used_bytes=mem, node_memory_total_bytes=10**12,
        pods=MappingProxyType({k: ResourceUsage(*v) for k, v in (pods or {}).items()}),
        host_apps=MappingProxyType({k: ResourceUsage(*v) for k, v in (apps or {}).items()}),
    )  # fmt: skip


@pytest.mark.parametrize(("values", "p", "expected"), [
    ([1], 0.5, 1), ([1, 2], 0.5, 1), ([1, 2, 3, 4], 0.5, 2), (list(range(1, 101)), 0.9, 90),
    (list(range(1, 101)), 0.99, 99), (list(range(1, 11)), 0.95, 9), ([5, 6, 7], 0.99, 6),
])  # fmt: skip
def test_percentile_is_koordlets(values: list[int], p: float, expected: int) -> None:
    assert percentile(values, p) == expected


def test_averages_over_the_aggregate_window_only() -> None:
    w = MetricWindow()
    w.add(_sample(0, 9000, 9000), [])
    for t in range(101, 161):
        w.add(_sample(t, 1000 + (t % 2) * 1000, 4096), [])
    status = w.status(CollectPolicy(aggregate_duration_seconds=60, durations=()), 160, "T")
    assert status.node_usage == Usage(1500, 4096)
    assert status.update_time == "T"


def test_system_usage_is_node_minus_pods_and_host_apps_never_below_zero() -> None:
    w = MetricWindow()
    w.add(_sample(1, 3000, 10_000, {"u1": (1000, 2000)}, {"nginx": (500, 1000)}), [("u1", WEB)],
          [HostAppMeta("nginx", "koord-prod", "LS")])
    w.add(_sample(2, 100, 100, {"u1": (1000, 2000)}), [("u1", WEB)])
    status = w.status(CollectPolicy(aggregate_duration_seconds=60, durations=()), 2, "T")
    assert status.system_usage == Usage((1500 + 0) // 2, (7000 + 0) // 2)


def test_percentiles_per_duration_with_cold_start() -> None:
    w = MetricWindow()
    for t in range(0, 200):
        w.add(_sample(t, t, 2 * t), [])
    status = w.status(CollectPolicy(durations=(100, 300, 1000)), 199, "T")
    (short, half, cold) = status.aggregated_node_usages
    values = list(range(99, 200))  # the samples in [99, 199]
    assert short.duration_seconds == 100
    assert short.usage["p50"] == Usage(percentile(values, 0.5), 2 * percentile(values, 0.5))
    assert short.usage["p99"] == Usage(percentile(values, 0.99), 2 * percentile(values, 0.99))
    assert set(short.usage) == {"p50", "p90", "p95", "p99"}
    assert half.usage["p90"].cpu_milli is not None, "199 s of samples cover more than half of 300 s"
    assert all(u.empty for u in cold.usage.values()), "199 s of samples are less than half of 1000 s"
    assert [a.duration_seconds for a in status.aggregated_system_usages] == [100, 300, 1000]


def test_pods_are_averaged_sorted_and_only_the_current_ones_reported() -> None:
    w = MetricWindow()
    w.add(_sample(1, 5000, 5000, {"u1": (100, 1000), "u2": (300, 3000), "gone": (1, 1)}),
          [("u1", WEB), ("u2", JOB), ("gone", PodMeta("x", "gone", "", ""))])
    w.add(_sample(2, 5000, 5000, {"u1": (300, 3000), "u2": (300, 3000)}), [("u1", WEB), ("u2", JOB)])
    w.add(_sample(3, 5000, 5000, {"u2": (300, 3000)}), [("u1", WEB), ("u2", JOB), ("new", PodMeta("a", "new", "", ""))])
    status = w.status(CollectPolicy(aggregate_duration_seconds=60, durations=()), 3, "T")
    assert [(p.namespace, p.name, p.usage, p.priority, p.qos) for p in status.pods] == [
        ("batch", "job", Usage(300, 3000), "koord-batch", "BE"),
        ("default", "web", Usage(200, 2000), "koord-prod", "LS"),
    ]


def test_host_applications() -> None:
    w = MetricWindow()
    w.add(_sample(1, 5000, 5000, apps={"nginx": (400, 800)}), [], [HostAppMeta("nginx", "koord-prod", "LS")])
    (app,) = w.status(CollectPolicy(durations=()), 1, "T").host_apps
    assert (app.name, app.usage, app.priority, app.qos) == ("nginx", Usage(400, 800), "koord-prod", "LS")


def test_old_samples_and_pods_are_forgotten_and_older_samples_ignored() -> None:
    w = MetricWindow()
    w.add(_sample(0, 1, 1, {"u1": (1, 1)}), [("u1", WEB)])
    w.add(_sample(RETENTION_SECONDS + BUCKET_SECONDS + 1, 2, 2), [])
    assert w.tracked == {"node": 1, "pods": 0, "apps": 0}
    w.add(_sample(5, 3, 3), [])
    assert w.tracked["node"] == 1, "a sample not newer than the last is ignored"


def test_no_samples_reports_empty_maps() -> None:
    status = MetricWindow().status(CollectPolicy(), 100, "T")
    assert status.node_usage.empty and status.system_usage.empty and not status.pods


def test_pod_meta_uses_koordinators_defaults() -> None:
    be = PodFacts(name="b", namespace="n", uid="u", kube_qos="BestEffort")
    assert PodMeta.of(be) == PodMeta("n", "b", "koord-batch", "BE")
    lsr = PodFacts(name="l", namespace="n", uid="u", labels={keys.LABEL_QOS_CLASS: "LSR"}, priority=9000)
    assert PodMeta.of(lsr) == PodMeta("n", "l", "koord-prod", "LSR")
