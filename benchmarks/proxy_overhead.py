"""Proxy overhead on real containerd: the same calls direct and through the proxy, interleaved
A/B in one run, reported as p50/p99 and proxy/direct ratios.

    .venv/bin/python benchmarks/proxy_overhead.py [--containerd 1.6] [--transport relay] [--quick]
    .venv/bin/python benchmarks/proxy_overhead.py --stub      # stub backend: the proxy's own cost
    .venv/bin/python benchmarks/proxy_overhead.py --rounds 5  # ours, koord-runtime-proxy, direct

The proxy runs as a real `runtime-proxy serve` process with every built-in plugin on. Targets
are printed next to the figures; nothing here is a test.

--rounds N compares, in N interleaved rounds on one containerd: direct calls, our proxy with every
built-in plugin, our proxy with none (`plugins: []`), and Koordinator's koord-runtime-proxy (built by
scripts/build-koord.sh; --koord PATH, or that script's cached binary). koord-runtime-proxy runs in
its containerd mode with no hook servers registered (its hook-server directory,
/etc/runtime/hookserver.d, is fixed in its code and must hold no *.json): its CRI server, request
parsing, sandbox/container store and transparent image-service proxy are on, so it is a pure
pass-through. A second koord arm, "koord-runtime-proxy + hook server", is Koordinator's own
architecture with every built-in plugin: koord-runtime-proxy calling our `runtime-proxy
hook-server` (Koordinator's RuntimeHookService, every hook point, failure policy Ignore) over its
gRPC hook client; the fixed directory is bind-mounted over from a private one in a mount namespace
of that process alone (`unshare -m`), so the pass-through arm still sees none. Without the binary
both koord arms are skipped with a message and the others still run.
Each round measures Version pass-through latency and proxy CPU per call, the 7-call pod lifecycle,
and each proxy's RSS; the table gives the median over rounds and the spread [min, max].

--baseline NAME=TREE (with --rounds; benchmarks/baseline.py) adds the arm "NAME, every plugin":
`runtime-proxy serve` of source tree TREE with every built-in plugin, interleaved with the others,
and a table of the per-round ratios "ours, every plugin" / "NAME, every plugin".
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rhp_devenv import PrivateContainerd, pod_cgroup_parent, remove_cgroup_tree  # noqa: E402
from rhp_devenv.cri import CriClient, container_config, linux_resources  # noqa: E402
from rhp_devenv.kube import free_port  # noqa: E402

from benchmarks import baseline as baseline_arm  # noqa: E402
from cri_protos import api_pb2  # noqa: E402
from tests.integration.harness import ProxyProcess, wait_for_socket  # noqa: E402

VERSION = "/runtime.v1.RuntimeService/Version"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def row(name: str, direct: list[float], proxied: list[float], target: str = "") -> None:
    d50, p50 = statistics.median(direct), statistics.median(proxied)
    d99, p99 = pct(direct, 0.99), pct(proxied, 0.99)
    print(f"{name:<34} {d50 * 1e3:9.3f} {p50 * 1e3:9.3f} {p50 / d50:7.2f}x {d99 * 1e3:9.3f} {p99 * 1e3:9.3f} "
          f"{p99 / d99:7.2f}x  {target}")


def header() -> None:
    print(f"{'call':<34} {'direct50':>9} {'proxy50':>9} {'ratio':>8} {'direct99':>9} {'proxy99':>9} {'ratio':>8}")


def timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def ab(n: int, direct: Callable[[], Any], proxied: Callable[[], Any]) -> tuple[list[float], list[float]]:
    d: list[float] = []
    p: list[float] = []
    for i in range(n):
        if i % 2:
            d.append(timed(direct))
            p.append(timed(proxied))
        else:
            p.append(timed(proxied))
            d.append(timed(direct))
    return d, p


def lifecycle(client: CriClient, top: str) -> None:
    uid = str(uuid.uuid4())
    parent = pod_cgroup_parent(top, "burstable", uid)
    pod = client.run_pod(cgroup_parent=parent, uid=uid, labels={"koordinator.sh/qosClass": "LS"})
    cid = client.create_container(pod.pod_id, container_config(resources=linux_resources(cpu_shares=512)), pod.config)
    client.start_container(cid)
    client.stop_container(cid)
    client.remove_container(cid)
    client.stop_pod_sandbox(pod.pod_id)
    client.remove_pod_sandbox(pod.pod_id)


def throughput(socket: str, clients: int, seconds: float) -> float:
    stop = time.monotonic() + seconds
    counts = [0] * clients

    def worker(i: int) -> None:
        with grpc.insecure_channel(f"unix://{socket}") as ch:
            mc = ch.unary_unary(VERSION)
            while time.monotonic() < stop:
                mc(b"", timeout=10)
                counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def fast_under_slow(socket: str, cid: str, n: int) -> tuple[list[float], list[float]]:
    with grpc.insecure_channel(f"unix://{socket}") as ch:
        mc = ch.unary_unary(VERSION)
        idle = [timed(lambda: mc(b"", timeout=10)) for _ in range(n)]
        slow = ch.unary_unary("/runtime.v1.RuntimeService/ExecSync")
        req = api_pb2.ExecSyncRequest(container_id=cid, cmd=["sleep", "3"]).SerializeToString()
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            futures = [pool.submit(slow, req, timeout=30) for _ in range(32)]
            time.sleep(0.5)
            busy = [timed(lambda: mc(b"", timeout=10)) for _ in range(n)]
            for f in futures:
                f.result()
    return idle, busy


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def run_real(args: argparse.Namespace) -> None:
    n = 60 if args.quick else 300
    top = f"/rhp-bench-{uuid.uuid4().hex[:6]}"
    with PrivateContainerd(args.containerd) as ctrd, tempfile.TemporaryDirectory() as tmp:
        listen = str(Path(tmp) / "proxy.sock")
        proxy = ProxyProcess(["--backend", str(ctrd.socket), "--transport", args.transport,
                              "--hook-server-dir", str(Path(tmp) / "hs.d")]).start(listen)
        try:
            direct, proxied = CriClient(str(ctrd.socket)), CriClient(listen)
            print(f"containerd {args.containerd}, transport {args.transport}, n={n}\n")
            header()
            row("Version", *ab(n, direct.version, proxied.version))
            pods = []
            for i in range(5 if args.quick else 10):
                uid = str(uuid.uuid4())
                pod = direct.run_pod(cgroup_parent=pod_cgroup_parent(top, "burstable", uid), uid=uid)
                for _ in range(10 if args.quick else 5):
                    direct.run_container(pod, start=i == 0)
                pods.append(pod)
            ids = [c.id for c in direct.list_containers()]
            print(f"-- with {len(ids)} containers --")
            row("ListPodSandbox", *ab(n, direct.list_pod_sandboxes, proxied.list_pod_sandboxes))
            row("ListContainers", *ab(n, direct.list_containers, proxied.list_containers), "target p50 <= 2.0x")
            row("ContainerStatus", *ab(n, lambda: direct.container_status(ids[0]),
                                      lambda: proxied.container_status(ids[0])))
            k = 4 if args.quick else 12
            row("full lifecycle (7 calls)", *ab(k, lambda: lifecycle(direct, top), lambda: lifecycle(proxied, top)),
                "target <= 1.05x")
            secs = 2.0 if args.quick else 4.0
            td, tp = throughput(str(ctrd.socket), 16, secs), throughput(listen, 16, secs)
            print(f"{'16-client Version throughput':<34} direct {td:8.0f}/s  proxy {tp:8.0f}/s  ratio {tp / td:5.2f}x"
                  "  target >= 0.5x")
            running = pods[0].container_ids[0]
            idle, busy = fast_under_slow(listen, running, 40)
            i50, b50 = statistics.median(idle), statistics.median(busy)
            print(f"{'fast call, 32 slow in flight':<34} idle p50 {i50 * 1e3:7.3f} ms  busy p50 "
                  f"{b50 * 1e3:7.3f} ms  ratio {b50 / i50:5.2f}x  target <= 3x")
            # 200 tracked containers: create the rest through the proxy so the store holds them.
            total = len(ids)
            while total < 200:
                uid = str(uuid.uuid4())
                pod = proxied.run_pod(cgroup_parent=pod_cgroup_parent(top, "burstable", uid), uid=uid)
                for _ in range(10):
                    proxied.run_container(pod, start=False)
                total += 10
            assert proxy.proc is not None
            print(f"{'proxy RSS, ' + str(total) + ' containers':<34} {rss_kib(proxy.proc.pid) / 1024:7.1f} MiB"
                  "  target <= 64 MiB")
            direct.remove_all_pods()
        finally:
            proxy.terminate()
            remove_cgroup_tree(top)


async def _stub_backend(path: str) -> Any:
    """A CRI stand-in that answers every unary call at once with an empty message."""
    server = grpc.aio.server()

    class Generic(grpc.GenericRpcHandler):  # type: ignore[misc]
        def service(self, details: Any) -> Any:
            async def answer(request: bytes, context: Any) -> bytes:
                return b""

            return grpc.unary_unary_rpc_method_handler(answer)

    server.add_generic_rpc_handlers((Generic(),))
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


def run_stub(args: argparse.Namespace) -> None:
    n = 500 if args.quick else 3000
    with tempfile.TemporaryDirectory() as tmp:
        backend = str(Path(tmp) / "stub.sock")
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        # Kept referenced: a grpc.aio server that is garbage-collected stops serving.
        stub = asyncio.run_coroutine_threadsafe(_stub_backend(backend), loop).result(10)
        listen = str(Path(tmp) / "proxy.sock")
        proxy = ProxyProcess(["--backend", backend, "--transport", args.transport,
                              "--hook-server-dir", str(Path(tmp) / "hs.d")]).start(listen)
        try:
            with grpc.insecure_channel(f"unix://{backend}") as dch, grpc.insecure_channel(f"unix://{listen}") as pch:
                d, p = dch.unary_unary(VERSION), pch.unary_unary(VERSION)
                for _ in range(50):
                    d(b""), p(b"")
                print(f"stub backend, transport {args.transport}, n={n}\n")
                header()
                row("Version (stub)", *ab(n, lambda: d(b""), lambda: p(b"")))
                body = api_pb2.StartContainerRequest(container_id="x" * 64).SerializeToString()
                sd, sp = dch.unary_unary("/runtime.v1.RuntimeService/StartContainer"), pch.unary_unary(
                    "/runtime.v1.RuntimeService/StartContainer")
                row("StartContainer, intercepted (stub)", *ab(n // 3, lambda: sd(body), lambda: sp(body)))
            td, tp = throughput(backend, 16, 2.0), throughput(listen, 16, 2.0)
            print(f"{'16-client throughput (stub)':<34} direct {td:8.0f}/s  proxy {tp:8.0f}/s  ratio {tp / td:5.2f}x")
        finally:
            proxy.terminate()
            asyncio.run_coroutine_threadsafe(stub.stop(None), loop).result(10)


sys.path.insert(0, str(REPO / "benchmarks" / "transport"))
# one finder of koord-runtime-proxy for every benchmark: benchmarks/transport/run.py's
from run import KOORD_HOOK_DIR, koord_binary  # type: ignore[import-not-found]  # noqa: E402


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM *proc* if it runs, SIGKILL after 20 s."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class KoordProcess:
    """koord-runtime-proxy as a child process, listening on *listen*, forwarding to *backend*."""

    def __init__(self, binary: Path, backend: str, log: Path, hook_dir: Path | None = None) -> None:
        """*hook_dir*: a directory of hook-server registrations to bind-mount over
        ``KOORD_HOOK_DIR`` in a mount namespace of this process alone (None: the host's, empty)."""
        self.binary, self.backend, self.log, self.hook_dir = binary, backend, log, hook_dir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, listen: str) -> KoordProcess:
        argv = [str(self.binary), "--koord-runtimeproxy-endpoint", listen,
                "--remote-runtime-service-endpoint", self.backend, "--backend-runtime-mode", "Containerd"]  # fmt: skip
        if self.hook_dir is not None:
            script = 'mount --bind "$0" "$1" && shift && exec "$@"'
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(self.hook_dir),
                    str(KOORD_HOOK_DIR), *argv]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        try:
            wait_for_socket(listen)
        except BaseException:
            self.terminate()
            raise
        return self

    def terminate(self) -> None:
        stop(self.proc)


class HookServerProcess:
    """``runtime-proxy hook-server`` with every built-in plugin, registering itself for every hook
    point (failure policy Ignore) in *register_dir* once it listens."""

    def __init__(self, register_dir: Path, log: Path) -> None:
        self.register_dir, self.log = register_dir, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = free_port()

    def stage_calls(self) -> dict[str, int]:
        """Plugin calls the server made, by stage (its /metrics): proof that koord called it."""
        import urllib.request

        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        calls: dict[str, int] = {}
        for line in text.splitlines():
            if line.startswith("rhp_plugin_duration_seconds_count{"):
                stage = line.split('stage="', 1)[1].split('"', 1)[0]
                calls[stage] = calls.get(stage, 0) + int(float(line.rsplit(" ", 1)[1]))
        return calls

    def start(self, listen: str) -> HookServerProcess:
        self.register_dir.mkdir(mode=0o755, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runtime_proxy.cli", "--log-format", "json", "hook-server",
                 "--listen", listen, "--register-dir", str(self.register_dir), "--failure-policy", "Ignore",
                 "--metrics-addr", f"127.0.0.1:{self.metrics_port}"],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
        deadline = time.monotonic() + 60
        while not any(self.register_dir.glob("*.json")):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.terminate()
                raise RuntimeError(f"runtime-proxy hook-server did not register (see {self.log})")
            time.sleep(0.1)
        return self

    def terminate(self) -> None:
        stop(self.proc)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    if not values:
        return "n/a"
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def run_rounds(args: argparse.Namespace) -> None:
    n = 100 if args.quick else 400
    k = 2 if args.quick else 8
    koord, why = koord_binary(args.koord)
    if koord is None:
        print(f"koord-runtime-proxy arm skipped: {why}")
    top = f"/rhp-bench-{uuid.uuid4().hex[:6]}"
    # koord-runtime-proxy creates its hook directory; leave the machine as found.
    made = [d for d in (KOORD_HOOK_DIR, KOORD_HOOK_DIR.parent) if not d.exists()]
    with PrivateContainerd(args.containerd) as ctrd, tempfile.TemporaryDirectory() as tmp:
        none_cfg = Path(tmp) / "no-plugins.json"
        none_cfg.write_text('{"plugins": []}')
        common = ["--backend", str(ctrd.socket), "--transport", args.transport,
                  "--hook-server-dir", str(Path(tmp) / "hs.d")]  # fmt: skip
        procs: dict[str, Any] = {
            "ours, every plugin": ProxyProcess(common).start(str(Path(tmp) / "ours.sock")),
            "ours, no plugins": ProxyProcess([*common, "--config", str(none_cfg)]).start(str(Path(tmp) / "none.sock")),
        }
        sockets = {"direct": str(ctrd.socket), "ours, every plugin": str(Path(tmp) / "ours.sock"),
                   "ours, no plugins": str(Path(tmp) / "none.sock")}  # fmt: skip
        base = args.baseline
        if base is not None:
            arm, sock = f"{base.name}, every plugin", str(Path(tmp) / "baseline.sock")
            procs[arm] = ProxyProcess(common, wrapper=base.wrapper()).start(sock)
            sockets[arm] = sock
        try:
            if koord is not None:
                sock = str(Path(tmp) / "koord.sock")
                koord_proc = KoordProcess(koord, str(ctrd.socket), Path(tmp) / "koord.log")
                procs["koord-runtime-proxy"] = koord_proc.start(sock)
                sockets["koord-runtime-proxy"] = sock
                KOORD_HOOK_DIR.mkdir(parents=True, exist_ok=True)  # the mount point (removed after if made)
                hooks = HookServerProcess(Path(tmp) / "koord-hooks.d", Path(tmp) / "hook-server.log")
                procs["koord's hook server"] = hooks.start(str(Path(tmp) / "hs.sock"))
                sock = str(Path(tmp) / "koord-hooked.sock")
                hooked = KoordProcess(koord, str(ctrd.socket), Path(tmp) / "koord-hooked.log", hooks.register_dir)
                procs["koord-runtime-proxy + hook server"] = hooked.start(sock)
                sockets["koord-runtime-proxy + hook server"] = sock
            arms = list(sockets)
            clients = {arm: CriClient(sock) for arm, sock in sockets.items()}
            print(f"containerd {args.containerd}, transport {args.transport}, {args.rounds} rounds, "
                  f"Version n={n} and {k} lifecycles per arm per round, arms interleaved: {', '.join(arms)}")
            if koord is not None:
                print(f"koord-runtime-proxy: {koord}, containerd mode, no hook servers "
                      f"({KOORD_HOOK_DIR} holds no *.json); koord-runtime-proxy + hook server: the same binary "
                      "with our `runtime-proxy hook-server` (every built-in plugin, every hook point) registered "
                      "in its own mount namespace; \"koord's hook server\" is that server's process (its CPU "
                      "and RSS add to the hooked arm's)")
            added: dict[str, list[float]] = {a: [] for a in arms}
            version: dict[str, list[float]] = {a: [] for a in arms}
            cpu: dict[str, list[float]] = {a: [] for a in [*arms, *procs]}
            life: dict[str, list[float]] = {a: [] for a in arms}
            rss: dict[str, list[float]] = {a: [] for a in [*arms, *procs]}
            for rnd in range(args.rounds):
                calls = {a: clients[a].version for a in arms}
                for a in arms:  # warm every connection before timing
                    calls[a]()
                cpu0 = {a: cpu_seconds(procs[a].proc.pid) for a in procs}
                samples: dict[str, list[float]] = {a: [] for a in arms}
                for i in range(n):
                    shift = i % len(arms)
                    for a in arms[shift:] + arms[:shift]:
                        samples[a].append(timed(calls[a]))
                for a in procs:
                    cpu[a].append((cpu_seconds(procs[a].proc.pid) - cpu0[a]) / n * 1e6)
                lsamples: dict[str, list[float]] = {a: [] for a in arms}
                for i in range(k):
                    shift = i % len(arms)
                    for a in arms[shift:] + arms[:shift]:
                        lsamples[a].append(timed(lambda a=a: lifecycle(clients[a], top)))
                d = statistics.median(samples["direct"])
                for a in arms:
                    version[a].append(statistics.median(samples[a]) * 1e3)
                    added[a].append((statistics.median(samples[a]) - d) * 1e3)
                    life[a].append(statistics.median(lsamples[a]) * 1e3)
                for a in procs:
                    rss[a].append(rss_kib(procs[a].proc.pid) / 1024)
                print(f"round {rnd + 1}: " + "; ".join(
                    f"{a} Version {version[a][-1]:.3f} ms, lifecycle {life[a][-1]:.1f} ms"
                    + (f", RSS {rss[a][-1]:.1f} MiB" if a in procs else "") for a in arms))
            print()
            print("| measure | " + " | ".join(arms) + " |")
            print("|---" * (len(arms) + 1) + "|")
            print("| Version p50, ms | " + " | ".join(spread(version[a]) for a in arms) + " |")
            print("| added by the proxy, ms | " + " | ".join("n/a" if a == "direct" else spread(added[a]) for a in arms)
                  + " |")
            print("| proxy CPU per Version call, µs | " + " | ".join(spread(cpu[a], "{:.0f}") for a in arms) + " |")
            print("| pod lifecycle (7 calls) p50, ms | " + " | ".join(spread(life[a], "{:.1f}") for a in arms) + " |")
            ratios = {a: [x / y for x, y in zip(life[a], life["direct"], strict=True)] for a in arms}
            print("| lifecycle / direct | " + " | ".join(spread(ratios[a], "{:.3f}") for a in arms) + " |")
            print("| proxy RSS per round, MiB | " + " | ".join(spread(rss[a], "{:.1f}") for a in arms) + " |")
            print("| proxy RSS first → last round, MiB | " + " | ".join(
                f"{rss[a][0]:.1f} → {rss[a][-1]:.1f}" if rss[a] else "n/a" for a in arms) + " |")
            for a in (p for p in procs if p not in arms):
                print(f"| {a} (its own process), RSS per round, MiB | " + spread(rss[a], "{:.1f}") + " |")
            if koord is not None:
                print(f"\nkoord's hook server made plugin calls by stage: {hooks.stage_calls()}")
            print("\nCells: median over rounds [min, max]; each round's figure is that round's median.")
            if koord is None:
                print(f"koord-runtime-proxy arm skipped: {why}")
            if base is not None:
                mine, theirs = "ours, every plugin", f"{base.name}, every plugin"
                baseline_arm.ratio_table(theirs, mine, {
                    label: (values[mine], values[theirs]) for label, values in (
                        ("Version p50, ms", version), ("proxy CPU per Version call, µs", cpu),
                        ("pod lifecycle (7 calls) p50, ms", life), ("proxy RSS, MiB", rss))})
            for c in clients.values():
                c.close()
            CriClient(str(ctrd.socket)).remove_all_pods()
        finally:
            for proc in procs.values():
                proc.terminate()
            remove_cgroup_tree(top)
            for d in made:
                with contextlib.suppress(OSError):  # only if still empty
                    d.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containerd", default="1.6")
    parser.add_argument("--transport", default="relay", choices=("relay", "grpc"))
    parser.add_argument("--stub", action="store_true", help="stub backend instead of containerd")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=0,
                        help="interleaved rounds of direct, ours and koord-runtime-proxy (see above)")
    parser.add_argument("--koord", help="koord-runtime-proxy binary (default: scripts/build-koord.sh's cached one)")
    baseline_arm.add_option(parser)
    args = parser.parse_args()
    if args.baseline is not None:
        args.rounds = args.rounds or 5
        args.baseline.check("runtime_proxy")
    os.environ.setdefault("PYTHONPATH", str(REPO))
    os.environ.setdefault("RHP_LOG_LEVEL", "warning")
    if args.rounds > 0:
        run_rounds(args)
    else:
        (run_stub if args.stub else run_real)(args)


if __name__ == "__main__":
    main()
