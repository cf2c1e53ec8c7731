"""Scale benchmark of the scheduler extender; targets live here, not in tests.

Setup, all on loopback: the fake API server (``tests/fakeapi.py``) in its own process, seeded
with N nodes (two sockets of 104 CPUs each: 2 x 52 cores x 2 threads), their
NodeResourceTopology objects and P placed LSR pods carrying ``resource-status`` cpusets; the
extender as ``scheduler-ext serve`` in its own process (watches, cache, HA ledger on); this
script as kube-scheduler, over keep-alive HTTP with kube-scheduler's JSON.

Phases:

1. sync: time until ``/readyz`` (the extender listed everything through ``rhp_kube.watch``).
2. latency: sequential cycles filter(500 names) -> prioritize(survivors) -> bind(best).
3. throughput: the same cycle, but binds run in a pool of 4 (kube-scheduler binds
   asynchronously while it schedules the next pod); pods/s over the whole phase.
4. memory: the extender's resident set (VmRSS) and peak (VmHWM) from /proc.

Run ``python benchmarks/extender_scale.py`` (full size: 5000 nodes, 50,000 pods, 500
candidates) or ``--quick`` (500 nodes, 5,000 pods, 500 candidates at most).

``--baseline NAME=TREE`` (benchmarks/baseline.py): a second fake API server and extender, the
extender being ``scheduler-ext serve`` of source tree TREE, seeded alike; the pending pods are
dealt into ``--rounds`` rounds, and each round runs phases 2 and 3 on the same pods and candidate
lists against both extenders, in alternating order; printed are the per-round ratios ours / NAME.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import baseline as baseline_arm  # noqa: E402
from koord_formats.topology import format_cpu_topology  # noqa: E402
from scheduler_ext.topology import synthetic_topology  # noqa: E402
from scheduler_ext.trust import Signer  # noqa: E402
from tests.scheduler_ext.builders import node, nrt, pod  # noqa: E402

TARGETS = {"filter_p99_ms": 20.0, "prioritize_p99_ms": 20.0, "bind_p99_ms": 30.0,
           "pods_per_s": 200.0, "rss_mib": 1024.0}
TOPO_TEXT = format_cpu_topology(synthetic_topology(2, 1, 52, 2))
RS = "scheduling.koordinator.sh/resource-status"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def placed_pods(node_names: list[str], per_node: int, rng: random.Random) -> list[dict[str, Any]]:
    """``per_node`` LSR pods per node with disjoint whole-core cpusets (2-8 CPUs each)."""
    out: list[dict[str, Any]] = []
    for name in node_names:
        core = rng.randrange(0, 20)
        for i in range(per_node):
            cores = rng.choice((1, 2, 3, 4))
            ids = [c for k in range(core, core + cores) for c in (k, k + 104)]
            core += cores
            p = pod(f"{name}-p{i}", cpu=str(len(ids)), node_name=name,
                    annotations={RS: json.dumps({"cpuset": ",".join(map(str, sorted(ids)))})})
            p["metadata"]["namespace"] = f"ns{i % 20}"
            out.append(p)
    return out


class Client:
    """kube-scheduler's side of the wire: keep-alive HTTP/1.1 with one connection per thread,
    as Go's ``http.Client`` pools them. Plain ``http.client`` instead of httpx: this process
    shares the two cores with the extender it measures, and httpx cost ~1.5 ms of CPU per call
    (4-6 ms per pod), more than kube-scheduler's Go client spends by far."""

    def __init__(self, url: str, timeout: float = 30) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port, self.timeout = host, int(port), timeout
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return conn

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in range(2):
            conn = self._conn()
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError):
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def post(self, path: str, doc: Any) -> Any:
        """POST ``doc`` as compact JSON and decode the 200 reply. orjson, not the stdlib: the
        stand-in scheduler sits on the measured path and shares the cores, and Go's
        encoding/json in kube-scheduler costs a fraction of what Python's json module does."""
        status, data = self.request("POST", path, orjson.dumps(doc))
        if status != 200:
            raise RuntimeError(f"{path}: HTTP {status}: {data[:200]!r}")
        return orjson.loads(data)

    def get(self, path: str) -> tuple[int, str]:
        status, data = self.request("GET", path)
        return status, data.decode()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()


class Cluster:
    """Fake API server process plus extender process."""

    def __init__(self, objects: list[dict[str, Any]], *, ledger: bool, extra: list[str],
                 wrapper: list[str] | None = None) -> None:
        """*wrapper*: a command prefix for the extender (``Baseline.wrapper()``: another tree's)."""
        self.tmp = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # noqa: SIM115
        json.dump(objects, self.tmp)
        self.tmp.close()
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.api = subprocess.Popen(
            [sys.executable, "-m", "tests.fakeapi", "--port", "0", "--load", self.tmp.name,
             "--history", "500000"],
            cwd=ROOT, stdout=subprocess.PIPE, env=env, text=True,
        )
        assert self.api.stdout is not None
        self.api_url = self.api.stdout.readline().strip()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.started = time.monotonic()
        key = Path(self.tmp.name).with_suffix(".seal")
        key.write_bytes(Signer.generate().pem())
        args = [*(wrapper or []), sys.executable, "-m", "scheduler_ext.cli", "serve", "--api-server", self.api_url,
                "--listen", f"127.0.0.1:{port}", "--log-level", "warning", "--signing-key-file", str(key)]
        if not ledger:
            args.append("--no-ha-ledger")
        args += extra
        self.ext = subprocess.Popen(args, cwd=ROOT, env=env)
        self.client = Client(self.url)

    def wait_ready(self, timeout: float = 600) -> float:
        """Poll ``/readyz`` as the kubelet would: on a connection of its own, not on the one
        kube-scheduler sends verbs over."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            probe = Client(self.url)
            try:
                if probe.get("/readyz")[0] == 200:
                    return time.monotonic() - self.started
            except OSError:
                pass
            finally:
                probe.close()
            time.sleep(0.2)
        raise TimeoutError("extender never became ready")

    def rss_mib(self) -> tuple[float, float]:
        fields = {}
        with open(f"/proc/{self.ext.pid}/status", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024

    def ext_counters(self) -> dict[str, float]:
        """The extender's user and system CPU seconds and context switches so far."""
        tick = os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{self.ext.pid}/stat", encoding="utf-8") as fh:
            fields = fh.read().rpartition(")")[2].split()
        out = {"user": int(fields[11]) / tick, "sys": int(fields[12]) / tick, "ctxsw": 0.0}
        for task in os.listdir(f"/proc/{self.ext.pid}/task"):
            try:
                with open(f"/proc/{self.ext.pid}/task/{task}/status", encoding="utf-8") as fh:
                    for line in fh:
                        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                            out["ctxsw"] += int(line.split()[1])
            except FileNotFoundError:
                continue
        return out

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) used so far by the extender, the fake API server and this
        process (the stand-in for kube-scheduler), all sharing the same cores."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for label, pid in (("extender", self.ext.pid), ("fake apiserver", self.api.pid)):
            with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
                fields = fh.read().rpartition(")")[2].split()
            out[label] = (int(fields[11]) + int(fields[12])) / tick
        t = os.times()
        out["client"] = t.user + t.system
        return out

    def close(self) -> None:
        self.client.close()
        for proc in (self.ext, self.api):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        os.unlink(self.tmp.name)
        Path(self.tmp.name).with_suffix(".seal").unlink(missing_ok=True)


def cycle(
    client: Client,
    p: dict[str, Any],
    candidates: list[str],
    timings: dict[str, list[float]],
    submit_bind: Callable[[dict[str, Any], str], None],
) -> bool:
    t0 = time.perf_counter()
    f = client.post("/filter", {"Pod": p, "Nodes": None, "NodeNames": candidates})
    t1 = time.perf_counter()
    timings["filter"].append((t1 - t0) * 1000)
    survivors = f["NodeNames"] or []
    if not survivors:
        return False
    if len(survivors) > 1:
        scores = client.post("/prioritize", {"Pod": p, "Nodes": None, "NodeNames": survivors})
        timings["prioritize"].append((time.perf_counter() - t1) * 1000)
        best = max(scores, key=lambda s: s["Score"])["Host"]
    else:
        best = survivors[0]
    submit_bind(p, best)
    return True


def do_bind(client: Client, p: dict[str, Any], target: str, timings: dict[str, list[float]],
            errors: list[str], lock: threading.Lock) -> None:
    t0 = time.perf_counter()
    reply = client.post("/bind", {"PodName": p["metadata"]["name"],
                                  "PodNamespace": p["metadata"]["namespace"],
                                  "PodUID": p["metadata"]["uid"], "Node": target})
    with lock:
        timings["bind"].append((time.perf_counter() - t0) * 1000)
        if reply["Error"]:
            errors.append(reply["Error"])


def start_profiler(pid: int, out: str) -> subprocess.Popen[bytes]:
    """py-spy (installed in the venv) sampling ``pid`` into collapsed stacks at ``out``."""
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(spy), "record", "-p", str(pid), "-o", out, "-f", "raw", "-r", "200", "--gil",
                             "--threads"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_profiler(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        proc.wait(60)


def run_phases(
    cl: Cluster, pending: list[dict[str, Any]], names: list[str], candidates: int, rng: random.Random,
    profile: str = "",
) -> dict[str, Any]:
    half = len(pending) // 2
    lock = threading.Lock()
    errors: list[str] = []
    seq: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
    for p in pending[:half]:
        cycle(cl.client, p, rng.sample(names, candidates), seq,
              lambda pp, n: do_bind(cl.client, pp, n, seq, errors, lock))
    par: dict[str, list[float]] = {"filter": [], "prioritize": [], "bind": []}
    binds = Client(cl.url)  # one keep-alive connection per pool thread
    spies = [start_profiler(pid, f"{profile}.{label}.txt")
             for label, pid in (("extender", cl.ext.pid), ("apiserver", cl.api.pid))] if profile else []
    cpu0, ext0 = cl.cpu_seconds(), cl.ext_counters()
    started = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        futures = []

        def submit(pp: dict[str, Any], n: str) -> None:
            futures.append(pool.submit(do_bind, binds, pp, n, par, errors, lock))

        for p in pending[half:]:
            cycle(cl.client, p, rng.sample(names, candidates), par, submit)
        for fut in futures:
            fut.result()
    wall = time.perf_counter() - started
    cpu1, ext1 = cl.cpu_seconds(), cl.ext_counters()
    for spy in spies:
        stop_profiler(spy)
    n_par = len(pending) - half
    cpu_ms = {k: (cpu1[k] - cpu0[k]) * 1000 / n_par for k in cpu0}
    ext = {k: round((ext1[k] - ext0[k]) * (1000 if k != "ctxsw" else 1) / n_par, 2) for k in ext0}
    return {"seq": seq, "par": par, "pods_per_s": n_par / wall, "errors": errors, "cpu_ms": cpu_ms,
            "ext": ext}


def report(title: str, rows: list[tuple[str, float, float | None, bool]], extra: dict[str, Any]) -> None:
    print(f"\n{title}")
    for k, v in extra.items():
        print(f"  {k}: {v}")
    print(f"  {'metric':<34}{'value':>12}{'target':>12}  verdict")
    for name, value, target, lower_is_better in rows:
        if target is None:
            verdict, t = "", ""
        else:
            ok = value <= target if lower_is_better else value >= target
            verdict = "PASS" if ok else "MISS"
            t = f"{target:.1f}"
        print(f"  {name:<34}{value:>12.2f}{t:>12}  {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 nodes, 5,000 placed pods")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--placed", type=int, default=50_000)
    parser.add_argument("--candidates", type=int, default=500)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--no-ledger", "--no-ha-ledger", dest="no_ledger", action="store_true",
                        help="single-replica mode (the extender runs with --no-ha-ledger)")
    parser.add_argument("--seed", type=int, default=1)
    baseline_arm.add_option(parser)
    parser.add_argument("--rounds", type=int, default=5, help="with --baseline: rounds the pending pods are dealt into")
    parser.add_argument("--ours-extender-arg", action="append", default=[], metavar="ARG",
                        help="with --baseline: an extra argument for our extender only (repeat), e.g. to "
                             "switch off a feature the baseline does not have")
    parser.add_argument("--extender-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for `scheduler-ext serve` (repeat), e.g. "
                             "--extender-arg=--switch-interval=0.005")
    parser.add_argument("--profile", default="", metavar="PREFIX",
                        help="py-spy the extender and the API server during the throughput phase "
                             "into PREFIX.extender.txt / PREFIX.apiserver.txt (collapsed stacks; "
                             "sampling adds CPU, so don't compare pods/s of such runs)")
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.placed, args.cycles = 500, 5000, 600
    rng = random.Random(args.seed)
    names = [f"node-{i:05d}" for i in range(args.nodes)]
    objects: list[dict[str, Any]] = []
    for n in names:
        objects.append(node(n))
        objects.append(nrt(n, TOPO_TEXT))
    objects += placed_pods(names, args.placed // args.nodes, rng)
    pending = [pod(f"new-{i:05d}", cpu="4", namespace="bench") for i in range(args.cycles)]
    objects += pending
    if args.baseline is not None:
        against_baseline(args, objects, pending, names)
        return
    t0 = time.monotonic()
    cl = Cluster(objects, ledger=not args.no_ledger, extra=args.extender_arg)
    del objects
    try:
        sync = cl.wait_ready()
        rss_sync, _ = cl.rss_mib()
        res = run_phases(cl, pending, names, min(args.candidates, len(names)), rng, args.profile)
        time.sleep(1)  # let the watch confirm the last binds
        rss, hwm = cl.rss_mib()
    finally:
        cl.close()
    seq, par = res["seq"], res["par"]
    rows = [
        ("filter p99 ms (sequential)", pct(seq["filter"], 99), TARGETS["filter_p99_ms"], True),
        ("prioritize p99 ms (sequential)", pct(seq["prioritize"], 99), TARGETS["prioritize_p99_ms"], True),
        ("bind p99 ms (sequential)", pct(seq["bind"], 99), TARGETS["bind_p99_ms"], True),
        ("filter p50 ms (sequential)", statistics.median(seq["filter"]), None, True),
        ("prioritize p50 ms (sequential)", statistics.median(seq["prioritize"]), None, True),
        ("bind p50 ms (sequential)", statistics.median(seq["bind"]), None, True),
        ("filter p99 ms (pipelined)", pct(par["filter"], 99), None, True),
        ("bind p99 ms (pipelined)", pct(par["bind"], 99), None, True),
        ("full cycle pods/s (pipelined)", res["pods_per_s"], TARGETS["pods_per_s"], False),
        *((f"CPU ms per pod, {k} (pipelined)", v, None, True) for k, v in res["cpu_ms"].items()),
        ("extender RSS MiB (end)", rss, TARGETS["rss_mib"], True),
        ("extender peak RSS MiB", hwm, TARGETS["rss_mib"], True),
    ]
    report(
        "extender_scale",
        rows,
        {
            "nodes": args.nodes, "placed pods": args.placed, "candidates": args.candidates,
            "cycles": args.cycles, "ha ledger": not args.no_ledger, "cpus": os.cpu_count(),
            "extender args": " ".join(args.extender_arg) or "(defaults)",
            "cache sync s": round(sync, 1), "RSS after sync MiB": round(rss_sync),
            "extender per pod (pipelined): user ms, sys ms, context switches": (
                f"{res['ext']['user']}, {res['ext']['sys']}, {res['ext']['ctxsw']}"),
            "bind errors": len(res["errors"]), "total s": round(time.monotonic() - t0, 1),
        },
    )
    if res["errors"]:
        print("  first bind error:", res["errors"][0])


def against_baseline(args: argparse.Namespace, objects: list[dict[str, Any]], pending: list[dict[str, Any]],
                     names: list[str]) -> None:
    """Ours and the baseline's extender, each with its own fake API server holding the same
    objects, run on the same pods round by round (see the module's docstring)."""
    base: baseline_arm.Baseline = args.baseline
    base.check("scheduler_ext")
    arms = ("ours", base.name)
    clusters: dict[str, Cluster] = {}
    try:
        for arm in arms:
            mine = [] if arm == base.name else args.ours_extender_arg
            clusters[arm] = Cluster(objects, ledger=not args.no_ledger, extra=[*args.extender_arg, *mine],
                                    wrapper=base.wrapper() if arm == base.name else None)
        sync = {arm: round(clusters[arm].wait_ready(), 1) for arm in arms}
        keys = ("filter p50 ms (sequential)", "prioritize p50 ms (sequential)", "bind p50 ms (sequential)",
                "filter p50 ms (pipelined)", "full cycle pods/s (pipelined)", "extender CPU ms per pod (pipelined)",
                "extender RSS MiB")
        values: dict[str, dict[str, list[float]]] = {arm: {k: [] for k in keys} for arm in arms}
        errors = 0
        for rnd, order in baseline_arm.orders(arms, args.rounds):
            pods = pending[rnd :: args.rounds]
            for arm in order:
                cl = clusters[arm]
                # the same candidate lists for both arms: one seed per round
                res = run_phases(cl, pods, names, min(args.candidates, len(names)), random.Random(args.seed + rnd))
                errors += len(res["errors"])
                row = (statistics.median(res["seq"]["filter"]), statistics.median(res["seq"]["prioritize"]),
                       statistics.median(res["seq"]["bind"]), statistics.median(res["par"]["filter"]),
                       res["pods_per_s"], res["cpu_ms"]["extender"], cl.rss_mib()[0])
                for key, value in zip(keys, row, strict=True):
                    values[arm][key].append(value)
            print(f"round {rnd + 1}: " + "; ".join(
                f"{arm} filter p50 {values[arm][keys[0]][-1]:.2f} ms, {values[arm][keys[4]][-1]:.0f} pods/s"
                for arm in arms), flush=True)
    finally:
        for cl in clusters.values():
            cl.close()
    print(f"\nextender_scale against {base.name} ({base.tree}): {args.nodes} nodes, {args.placed} placed pods, "
          f"{len(pending)} pending pods in {args.rounds} rounds, ha ledger {not args.no_ledger}, "
          f"cache sync s {sync}, bind errors {errors}, ours also with {args.ours_extender_arg or 'nothing'}")
    baseline_arm.ratio_table(base.name, "ours", {k: (values["ours"][k], values[base.name][k]) for k in keys})


if __name__ == "__main__":
    main()
