"""CPU cost of the node reports (``report.enable``, runtime_proxy/report/) with 200 containers, as
a share of one core (speed is reported here, never asserted in tests).

The pods of ``benchmarks/qos_loops.py`` (100 LS, 100 BE, one container each, in a prepared
cgroup v1 tree; ``/proc`` is the real one) are sampled once per simulated second by a real
``UsageSampler``, as the usage loop does, and a ``Reporter`` reading that sampler's window runs
as it runs in the proxy: its metrics round every second (new samples folded into the window; a
NodeMetric status built, formatted and PUT every ``--report-interval`` s) and its topology round
every ``report.intervalSeconds`` (10 s: the NRT and Device parts built and compared with what was
written; nothing changes, so nothing is read or written between resyncs). The API server is the
in-process fake of ``tests/fakeapi.py``, in threads of its own whose CPU is not counted.

Measured in one process, interleaved second by second over ``--seconds`` simulated seconds
(``time.thread_time`` of the calling thread, which makes every reporter call and its HTTP
requests): the sampler's CPU (what the usage loop already spends) and the reporter's CPU on top
of it. CPU per simulated second is the share of one core. Target: the reporter <= 1% of one core
on top of the loops. Then the same with the reporter's own sampler (the usage loop off), whose
cost is the sampler's plus the reporter's.

    python benchmarks/report_cost.py [--pods 100] [--seconds 300] [--report-interval 60]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import kubernetes  # noqa: E402
from qos_loops import prepare  # noqa: E402

from hooks.facts import CPUInfo, CPUTopology  # noqa: E402
from runtime_proxy.host.cgroups import Cgroups  # noqa: E402
from runtime_proxy.loops.usage import UsageSampler  # noqa: E402
from runtime_proxy.report.config import ReportConfig  # noqa: E402
from runtime_proxy.report.loop import Reporter  # noqa: E402
from runtime_proxy.report.writer import KubeObjects  # noqa: E402
from tests.fakeapi import FakeAPIServer  # noqa: E402

NODE = "bench-node"


class Clock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


def run(pods: int, seconds: int, report_interval: int, *, shared: bool) -> tuple[float, float, int]:
    """(sampler CPU s, reporter CPU s, NodeMetric writes) over ``seconds`` simulated seconds."""
    with tempfile.TemporaryDirectory(prefix="rhp-report-bench-") as tmp, FakeAPIServer() as api:
        root = Path(tmp)
        backend, _ = prepare(root, pods)
        cgroups = Cgroups(root, version=1)
        api.register("slo.koordinator.sh", "v1alpha1", "nodemetrics", "NodeMetric", False)
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        api.create({"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeMetric", "metadata": {"name": NODE},
                    "spec": {"metricCollectPolicy": {"reportIntervalSeconds": report_interval}}})
        conf = kubernetes.client.Configuration()
        conf.host = api.url
        clock = Clock()
        topology = CPUTopology(CPUInfo(id=i, core=i % 16, socket=i // 32, node=i // 32) for i in range(64))
        sampler = UsageSampler(cgroups, clock=clock) if shared else None
        reporter = Reporter(
            ReportConfig(enable=True, kubeletConfigFile="", sysRoot=str(root / "sys"), procRoot=str(root / "proc"),
                         nodeMetricMinIntervalSeconds=min(30, report_interval)),
            backend, node_name=NODE, topology=topology, cgroups=cgroups, sampler=sampler,
            objects=KubeObjects(kubernetes.client.ApiClient(conf)), clock=clock,
        )  # fmt: skip
        node = backend.node()
        with_containers = [p.replace(containers=(c,)) for p, c in backend.containers()]
        sample_cpu = report_cpu = 0.0
        for second in range(seconds):
            clock.now += 1
            if sampler is not None:
                start = time.thread_time()
                sampler.sample(node, with_containers)
                sample_cpu += time.thread_time() - start
            start = time.thread_time()
            reporter.metrics_round()
            if second % 10 == 0:
                reporter.topology_round()
            report_cpu += time.thread_time() - start
        return sample_cpu, report_cpu, api.counts.get("PUT", 0)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pods", type=int, default=100, help="pods per class (LS and BE), one container each")
    parser.add_argument("--seconds", type=int, default=300, help="simulated seconds")
    parser.add_argument("--report-interval", type=int, default=60, help="the NodeMetric's reportIntervalSeconds")
    args = parser.parse_args(argv)
    containers = 2 * args.pods
    print(f"{containers} containers, {args.seconds} simulated seconds, a NodeMetric report every "
          f"{max(args.report_interval, min(30, args.report_interval))} s, topology every 10 s")
    sample_s, report_s, puts = run(args.pods, args.seconds, args.report_interval, shared=True)
    own_sample_s, own_s, _ = run(args.pods, args.seconds, args.report_interval, shared=False)
    per = args.seconds
    print(f"usage loop's sampler (already spent)        {100 * sample_s / per:6.3f} % of one core")
    print(f"reporter on top of it (shared sampler)      {100 * report_s / per:6.3f} % of one core  (target <= 1 %)")
    print(f"reporter with its own sampler (loop off)    {100 * own_s / per:6.3f} % of one core")
    print(f"writes (PUT) in the shared run: {puts} (NodeMetric status reports; the NRT was created once, by POST, "
          "and never rewritten)")
    assert own_sample_s == 0.0
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
