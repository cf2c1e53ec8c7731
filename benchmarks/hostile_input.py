"""Hostile input against the proxy on real containerd: the event loop's worst stall and the
proxy's peak RSS while poisoned pods and simple relay attacks run next to healthy pods.

    .venv/bin/python benchmarks/hostile_input.py [--containerd 1.6] [--seconds 20] [--quick]

Phases in one run, each with a fresh proxy (relay transport, every built-in plugin) in front of
one private containerd (``rhp_devenv``). In every phase healthy pods are created and removed
through the proxy in a loop and a pass-through ``Version`` call is made every 10 ms; the
baseline phase does only that, each other phase adds attacks:

- poisoned pods: pods whose annotations are poisoned (resource-status ``"[" * 3000``, a NUMA cpu
  quantity of ``1e9999999``, ``Infinity``, a 160 KB cpuset, deeply nested resource-spec JSON),
  one every 0.1 s;
- CONTINUATION flood: HEADERS without END_HEADERS followed by 16 KiB CONTINUATION frames, up to
  64 MiB per connection, reconnecting when the relay closes it;
- never-reading client: opens its windows, sends ListContainers on stream after stream and
  never reads a byte;
- all attacks at once;
- node config reloads (``--only nodecfg``): the proxy's node config file is replaced every 3 s
  by a valid one just under ``MAX_NODE_CONFIG_BYTES`` (as in the NRI phase below).

The proxy runs in a child process (this file with ``--child``) next to a loop-lag probe: a task
that sleeps 5 ms and records how late it wakes up. Peak RSS is the child's ``VmHWM``. Targets:
worst stall <= 50 ms, peak RSS <= 96 MiB. Nothing here is a test.

NRI phases (``--only nri``, or ``nri-slow`` / ``nri-sync`` / ``nri-nodecfg`` for one attack; they need no
containerd): ``runtime-proxy nri`` (every built-in plugin, the loops, as ``runtime_proxy.commands.nri``
runs it) in a child with the same probe, registered with a runtime played by this process.
Sessions alternate: a healthy one (Configure, a small Synchronize, then 2 s of LS and LSR pod
lifecycles, each event waiting for its reply, then the socket closes as when containerd
restarts) and, except in the baseline, an attacked one:

- never-reading runtime: after a small Synchronize, UpdateContainer requests for its one
  container as fast as the plugin takes them, never reading a reply, until the plugin closes the
  session (at most 20 s);
- Synchronize flood: 40 chunks of 12 MiB with ``more`` (48 pods with 256 KiB of annotations
  each), each sent when the previous one is answered, until the plugin refuses one;
- node config reloads (``nri-nodecfg``): the plugin's node config file is replaced every 3 s by
  a valid one just under ``MAX_NODE_CONFIG_BYTES`` (a 4096-CPU cpu-topology in the node and NRT
  annotations, the example NodeSLO, labels for the rest), its labels alternating, while healthy
  sessions run.

``--baseline-repo DIR`` runs each NRI phase twice, interleaved: first with the plugin imported
from another checkout (DIR, e.g. a worktree of an older commit), then with this one's.

The NRI table also shows how much of the worst stall the loop's thread spent on the CPU: on a
shared machine most of a wall-clock stall can be time spent waiting for a CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import hpack

REPO = Path(__file__).resolve().parents[1]
# The code under test: this checkout, or (children of --baseline-repo rows) another one.
CODE = Path(os.environ.get("RHP_BENCH_CODE") or REPO)
sys.path.insert(0, str(CODE))

from koord_formats.keys import ANNOTATION_RESOURCE_SPEC, ANNOTATION_RESOURCE_STATUS, LABEL_QOS_CLASS  # noqa: E402

VERSION = "/runtime.v1.RuntimeService/Version"
PROBE_INTERVAL = 0.005
POISON_PAUSE = 0.1  # seconds between two poisoned pods
STALL_TARGET_MS = 50.0
RSS_TARGET_MIB = 96.0

POISONS: dict[str, dict[str, str]] = {
    "resource-status [ x3000": {ANNOTATION_RESOURCE_STATUS: "[" * 3000},
    "numa cpu 1e9999999": {ANNOTATION_RESOURCE_STATUS: json.dumps(
        {"cpuset": "0", "numaNodeResources": [{"node": 0, "resources": {"cpu": "1e9999999"}}]})},
    "numa cpu Infinity": {ANNOTATION_RESOURCE_STATUS:
                          '{"cpuset": "0", "numaNodeResources": [{"node": 0, "resources": {"cpu": Infinity}}]}'},
    "160 KB cpuset": {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": ("0-16383," * 20000).rstrip(",")})},
    "deep resource-spec": {ANNOTATION_RESOURCE_SPEC: '{"a":' * 5000 + "1" + "}" * 5000},
}


# ---- the child: the proxy and the loop-lag probe ------------------------------------------------


@dataclass
class LagStats:
    lags: list[float] = field(default_factory=list)
    worst: float = 0.0
    # The largest part of a lag the loop's thread spent on the CPU (the rest it waited for a CPU,
    # which on a shared machine is other processes' doing).
    worst_on_cpu: float = 0.0

    def report(self) -> dict[str, float]:
        lags = sorted(self.lags) or [0.0]
        return {
            "worst_ms": self.worst * 1e3,
            "worst_on_cpu_ms": self.worst_on_cpu * 1e3,
            "p99_ms": lags[min(len(lags) - 1, int(0.99 * len(lags)))] * 1e3,
            "over_50ms": float(sum(1 for x in lags if x > 0.05)),
            "samples": float(len(self.lags)),
            "hwm_mib": _status_kib("VmHWM") / 1024,
            "rss_mib": _status_kib("VmRSS") / 1024,
            "node_config_generation": _sample("rhp_node_config_generation"),
        }


def _status_kib(key: str, pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def _sample(name: str, labels: dict[str, str] | None = None) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def _probe(stats: LagStats) -> None:
    loop = asyncio.get_running_loop()
    while True:
        start, cpu = loop.time(), time.thread_time()
        await asyncio.sleep(PROBE_INTERVAL)
        lag = max(0.0, loop.time() - start - PROBE_INTERVAL)
        stats.lags.append(lag)
        stats.worst = max(stats.worst, lag)
        stats.worst_on_cpu = max(stats.worst_on_cpu, min(lag, time.thread_time() - cpu))


def _control(stats: LagStats) -> None:
    """Answer the parent on stdin/stdout: ``reset`` clears the lag figures, ``report`` prints them."""
    for line in sys.stdin:
        command = line.strip()
        if command == "reset":
            stats.lags, stats.worst, stats.worst_on_cpu = [], 0.0, 0.0
            print("ok", flush=True)
        elif command == "report":
            print(json.dumps(stats.report()), flush=True)


def child(args: argparse.Namespace) -> None:
    from runtime_proxy import logs
    from runtime_proxy.config import ProxyConfig
    try:
        from runtime_proxy.commands.serve import ProxyOptions, serve
    except ImportError:  # --baseline-repo: a checkout from before runtime_proxy/commands/
        from runtime_proxy.server import ProxyOptions, serve  # type: ignore[no-redef]

    logs.configure("json", "warning")
    cfg = ProxyConfig(hookServerDir=args.hook_server_dir, nodeConfigFile=args.node_config)
    opts = ProxyOptions(listen=args.listen, backend=args.backend, config=cfg, transport="relay",
                        entry_points=False)
    stats = LagStats()
    threading.Thread(target=_control, args=(stats,), daemon=True).start()

    async def main() -> None:
        probe = asyncio.create_task(_probe(stats))
        try:
            await serve(opts)
        finally:
            probe.cancel()

    import uvloop

    uvloop.run(main())


# ---- the parent: workload, attacks, report -----------------------------------------------------


class Child:
    def __init__(self, listen: str, backend: str, hs_dir: str, log: Path, node_config: Path,
                 code: Path = REPO) -> None:
        self.log = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", "--listen", listen, "--backend", backend,
             "--hook-server-dir", hs_dir, "--node-config", str(node_config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "PYTHONPATH": str(code), "RHP_BENCH_CODE": str(code)},
        )

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        if not ready:
            raise TimeoutError(f"proxy did not answer {command!r}")
        return self.proc.stdout.readline().strip()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def wait_ready(path: str, timeout: float = 30.0) -> None:
    import grpc

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            try:
                with grpc.insecure_channel(f"unix://{path}") as ch:
                    ch.unary_unary(VERSION)(b"", timeout=1)
                return
            except grpc.RpcError:
                pass
        time.sleep(0.05)
    raise TimeoutError(f"proxy socket {path} not ready")


@dataclass
class Outcomes:
    ok: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)

    def add(self, fn: Callable[[], Any]) -> None:
        import grpc

        start = time.perf_counter()
        try:
            fn()
        except grpc.RpcError as exc:
            self.failed += 1
            key = f"{exc.code().name}"
            self.errors[key] = self.errors.get(key, 0) + 1
        else:
            self.ok += 1
        self.latencies.append(time.perf_counter() - start)


def pass_through(listen: str, stop: threading.Event, out: Outcomes) -> None:
    import grpc

    with grpc.insecure_channel(f"unix://{listen}") as ch:
        version = ch.unary_unary(VERSION)
        while not stop.is_set():
            out.add(lambda: version(b"", timeout=10))
            time.sleep(0.01)


def pods(env: Any, listen: str, stop: threading.Event, out: Outcomes,
         annotations: list[dict[str, str]], labels: dict[str, str], pause: float = 0.0) -> None:
    """Create a pod with one running container through the proxy, remove it, repeat (waiting
    ``pause`` seconds between pods)."""
    import grpc
    from rhp_devenv.cri import CriClient

    i = 0
    with CriClient(listen, timeout=30) as cri, CriClient(str(env.socket), timeout=30) as direct:
        while not stop.is_set():
            ann = annotations[i % len(annotations)]
            i += 1

            def one(ann: dict[str, str] = ann) -> None:
                pod = cri.run_pod(cgroup_parent=env.new_cgroup_parent(), labels=labels, annotations=ann)
                try:
                    cri.run_container(pod)
                finally:
                    with contextlib.suppress(grpc.RpcError):
                        direct.remove_pod(pod)

            failed = out.failed
            out.add(one)
            if pause or out.failed > failed:
                stop.wait(max(pause, 0.1))  # a failing pod is retried the way kubelet would: not at once


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, CONTINUATION, SETTINGS, WINDOW_UPDATE, DATA = 1, 9, 4, 8, 0
END_STREAM, END_HEADERS = 0x1, 0x4


def _request_headers(encoder: hpack.Encoder, path: str) -> bytes:
    return bytes(encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path),
                                 (":authority", "localhost"), ("content-type", "application/grpc"),
                                 ("te", "trailers")]))


@dataclass
class AttackCounts:
    connections: int = 0
    closed_by_proxy: int = 0
    sent_mib: float = 0.0
    streams: int = 0
    config_writes: int = 0


def continuation_flood(listen: str, stop: threading.Event, out: AttackCounts) -> None:
    import hpack

    chunk = _frame(CONTINUATION, 0, 1, b"\x00" * 16384)
    while not stop.is_set():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        try:
            sock.connect(listen)
            out.connections += 1
            first = _request_headers(hpack.Encoder(), "/runtime.v1.RuntimeService/ListContainers")
            sock.sendall(PREFACE + _frame(SETTINGS, 0, 0, b"") + _frame(HEADERS, 0, 1, first))
            sent = 0
            while sent < 64 << 20 and not stop.is_set():
                sock.sendall(chunk)
                sent += len(chunk)
                out.sent_mib += len(chunk) / (1 << 20)
        except TimeoutError:
            # The proxy stopped reading: hold the connection for a while, as an attacker would.
            stop.wait(2.0)
        except OSError:
            out.closed_by_proxy += 1
        finally:
            sock.close()
        stop.wait(0.01)  # a CONTINUATION attack, not a connection-rate attack


def never_reads(listen: str, stop: threading.Event, out: AttackCounts) -> None:
    import hpack

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(1.0)
    try:
        sock.connect(listen)
        out.connections += 1
        settings = (0x4).to_bytes(2, "big") + (2**31 - 1).to_bytes(4, "big")
        sock.sendall(PREFACE + _frame(SETTINGS, 0, 0, settings)
                     + _frame(WINDOW_UPDATE, 0, 0, (2**31 - 1 - 65535).to_bytes(4, "big")))
        encoder = hpack.Encoder()
        body = b"\x00" + len(b"").to_bytes(4, "big")
        stream = 1
        while not stop.is_set() and stream < 2**31 - 1:
            block = _request_headers(encoder, "/runtime.v1.RuntimeService/ListContainers")
            try:
                sock.sendall(_frame(HEADERS, END_HEADERS, stream, block) + _frame(DATA, END_STREAM, stream, body))
            except TimeoutError:
                stop.wait(0.5)  # the proxy stopped reading our requests; keep the connection open
                continue
            out.streams += 1
            stream += 2
    except OSError:
        out.closed_by_proxy += 1
    finally:
        stop.wait()
        sock.close()


# ---- NRI: the plugin as a child, the runtime played here -----------------------------------------


def nri_child(args: argparse.Namespace) -> None:
    """``runtime-proxy nri`` as the CLI runs it, next to the loop-lag probe (no gRPC is loaded)."""
    from runtime_proxy import logs
    from runtime_proxy.config import ProxyConfig
    try:
        from runtime_proxy.commands.nri import NriOptions, run
    except ImportError:  # --baseline-repo: a checkout from before runtime_proxy/commands/
        from runtime_proxy.nri.cli import NriOptions, run  # type: ignore[no-redef]

    logs.configure("json", "warning")
    tmp = Path(args.tmp)
    cfg = ProxyConfig(hookServerDir=str(tmp / "hs.d"), cgroupRoot=str(tmp / "cgroup"), nodeConfigFile=args.node_config,
                      resctrlRoot=str(tmp / "resctrl"))
    opts = NriOptions(socket=args.nri_socket, config=cfg, entry_points=False)
    stats = LagStats()
    threading.Thread(target=_control, args=(stats,), daemon=True).start()

    async def main() -> None:
        probe = asyncio.create_task(_probe(stats))
        try:
            await run(opts)
        finally:
            probe.cancel()

    asyncio.run(main())


NRI_HEALTHY_SECONDS = 2.0
NRI_SLOW_LIMIT = 20.0  # seconds an attacked session may last before this side gives up
SYNC_CHUNKS = 40
SYNC_PODS_PER_CHUNK = 48
SYNC_ANNOTATION = 256 << 10


class NriWire:
    """The runtime's end of one NRI session on a blocking socket: requests on connection 1,
    RegisterPlugin (and any other call of the plugin's) served on connection 2."""

    def __init__(self, sock: socket.socket) -> None:
        from runtime_proxy.nri import mux, ttrpc

        self.mux, self.ttrpc = mux, ttrpc
        self.sock = sock
        self.frames = mux.FrameDecoder()
        self.replies = ttrpc.MessageDecoder(ttrpc.MAX_RECV_MESSAGE)
        self.calls = ttrpc.MessageDecoder(ttrpc.MAX_RECV_MESSAGE)
        self.next_stream = 1
        self.answered: dict[int, Any] = {}

    def _read(self) -> None:
        from cri_protos import ttrpc_pb2

        data = self.sock.recv(1 << 20)
        if not data:
            raise ConnectionResetError("the plugin closed the session")
        for conn_id, payload in self.frames.feed(data):
            if conn_id == self.mux.PLUGIN_CONN:
                for msg in self.replies.feed(payload):
                    self.answered[msg.stream_id] = ttrpc_pb2.Response.FromString(msg.payload)
            elif conn_id == self.mux.RUNTIME_CONN:
                for msg in self.calls.feed(payload):
                    request = ttrpc_pb2.Request.FromString(msg.payload)
                    if request.method == "RegisterPlugin":
                        self.registered = True
                    reply = ttrpc_pb2.Response().SerializeToString()
                    self.sock.sendall(self.mux.encode(self.mux.RUNTIME_CONN, self.ttrpc.encode_message(
                        msg.stream_id, self.ttrpc.TYPE_RESPONSE, reply)))

    def register(self, timeout: float = 10.0) -> None:
        self.registered = False
        self.sock.settimeout(timeout)
        while not self.registered:
            self._read()

    def send(self, method: str, payload: bytes) -> int:
        """Send a request (whatever its size) without waiting; its stream id."""
        from cri_protos import ttrpc_pb2

        stream_id = self.next_stream
        self.next_stream += 2
        request = ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Plugin", method=method, payload=payload,
                                    timeout_nano=2_000_000_000).SerializeToString()
        message = self.ttrpc.HEADER.pack(len(request), stream_id, self.ttrpc.TYPE_REQUEST, 0) + request
        self.sock.sendall(self.mux.encode(self.mux.PLUGIN_CONN, message, 1 << 20))
        return stream_id

    def call(self, method: str, payload: bytes, timeout: float = 10.0) -> Any:
        stream_id = self.send(method, payload)
        self.sock.settimeout(timeout)
        while stream_id not in self.answered:
            self._read()
        return self.answered.pop(stream_id)


@dataclass
class NriCounts:
    sessions: int = 0
    healthy_sessions: int = 0
    attacked: int = 0
    closed_by_plugin: int = 0
    left_open: int = 0
    healthy_cut: int = 0
    lifecycles: Outcomes = field(default_factory=Outcomes)
    requests_sent: int = 0
    close_after: list[float] = field(default_factory=list)
    chunks_before_refusal: list[int] = field(default_factory=list)
    refusals: dict[str, int] = field(default_factory=dict)
    config_writes: int = 0


def _nri_pod(pod_id: str, qos: str, cpuset: str = "") -> Any:
    from cri_protos import nri_pb2

    annotations = {ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": cpuset})} if cpuset else {}
    pod = nri_pb2.PodSandbox(id=pod_id, name=pod_id, uid=f"uid-{pod_id}", namespace="bench",
                             labels={LABEL_QOS_CLASS: qos}, annotations=annotations)
    pod.linux.cgroup_parent = f"/kubepods/burstable/pod{pod_id}"
    return pod


def _nri_container(cid: str, pod_id: str) -> Any:
    from cri_protos import nri_pb2

    container = nri_pb2.Container(id=cid, pod_sandbox_id=pod_id, name="app", state=nri_pb2.CONTAINER_RUNNING)
    container.linux.resources.cpu.shares.value = 1024
    container.linux.resources.cpu.quota.value = 100_000
    container.linux.resources.cpu.period.value = 100_000
    return container


def _lifecycle(wire: NriWire, index: int) -> None:
    """One pod's life as containerd reports it, each event waiting for its reply; raises on an
    error status."""
    from cri_protos import nri_pb2

    E = nri_pb2.Event
    qos, cpuset = ("LSR", "0") if index % 2 else ("LS", "")
    pod = _nri_pod(f"p{index}", qos, cpuset)
    container = _nri_container(f"c{index}", pod.id)
    steps: list[tuple[str, Any]] = [
        ("StateChange", nri_pb2.StateChangeEvent(event=E.RUN_POD_SANDBOX, pod=pod)),
        ("CreateContainer", nri_pb2.CreateContainerRequest(pod=pod, container=container)),
        ("StateChange", nri_pb2.StateChangeEvent(event=E.START_CONTAINER, pod=pod, container=container)),
        ("StateChange", nri_pb2.StateChangeEvent(event=E.POST_START_CONTAINER, pod=pod, container=container)),
        ("StopContainer", nri_pb2.StopContainerRequest(pod=pod, container=container)),
        ("StateChange", nri_pb2.StateChangeEvent(event=E.REMOVE_CONTAINER, pod=pod, container=container)),
        ("StateChange", nri_pb2.StateChangeEvent(event=E.STOP_POD_SANDBOX, pod=pod)),
        ("StateChange", nri_pb2.StateChangeEvent(event=E.REMOVE_POD_SANDBOX, pod=pod)),
    ]
    for method, message in steps:
        reply = wire.call(method, message.SerializeToString())
        if reply.HasField("status") and reply.status.code:
            raise RuntimeError(f"{method}: status {reply.status.code} {reply.status.message}")


def _timed(out: Outcomes, fn: Callable[[], Any]) -> None:
    """Run ``fn``, counting an error status (``RuntimeError``) as a failure."""
    start = time.perf_counter()
    try:
        fn()
    except RuntimeError as exc:
        out.failed += 1
        key = str(exc).split(":")[0]
        out.errors[key] = out.errors.get(key, 0) + 1
    else:
        out.ok += 1
    out.latencies.append(time.perf_counter() - start)


def _sync_flood_chunk() -> bytes:
    from cri_protos import nri_pb2

    pods = [nri_pb2.PodSandbox(id=f"flood{i}", name=f"flood{i}", uid=f"uid-flood{i}", namespace="bench",
                               annotations={"example.com/filler": "x" * SYNC_ANNOTATION})
            for i in range(SYNC_PODS_PER_CHUNK)]
    return nri_pb2.SynchronizeRequest(pods=pods, more=True).SerializeToString()


def nri_runtime(path: str, stop: threading.Event, attacks: frozenset[str], out: NriCounts) -> None:
    """Accept the plugin's sessions until ``stop``; alternate healthy and attacked ones."""
    from cri_protos import nri_pb2

    chunk = _sync_flood_chunk() if "nri-sync" in attacks else b""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    server.settimeout(0.5)
    index = 0
    try:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            out.sessions += 1
            attacked = bool(attacks & {"nri-slow", "nri-sync"}) and out.sessions % 2 == 0
            try:
                wire = NriWire(conn)
                wire.register()
                wire.call("Configure", nri_pb2.ConfigureRequest(
                    runtime_name="hostile-bench", runtime_version="1", request_timeout=2000).SerializeToString())
                if attacked and "nri-sync" in attacks:
                    out.attacked += 1
                    sync_flood(wire, chunk, stop, out)
                    continue
                wire.call("Synchronize", nri_pb2.SynchronizeRequest(
                    pods=[_nri_pod("resident", "LS")],
                    containers=[_nri_container("resident-c", "resident")]).SerializeToString())
                if attacked:
                    out.attacked += 1
                    never_reading_runtime(wire, stop, out)
                    continue
                deadline = time.monotonic() + NRI_HEALTHY_SECONDS
                while time.monotonic() < deadline and not stop.is_set():
                    index += 1
                    _timed(out.lifecycles, lambda i=index, w=wire: _lifecycle(w, i))
                out.healthy_sessions += 1
            except OSError:
                out.healthy_cut += 1  # the plugin went away (the phase ends) in a healthy session
            finally:
                conn.close()
    finally:
        server.close()


def never_reading_runtime(wire: NriWire, stop: threading.Event, out: NriCounts) -> None:
    from cri_protos import nri_pb2

    request = nri_pb2.UpdateContainerRequest(pod=_nri_pod("resident", "LS"),
                                             container=_nri_container("resident-c", "resident"))
    request.linux_resources.cpu.shares.value = 512
    payload = request.SerializeToString()
    started = time.monotonic()
    wire.sock.settimeout(None)  # a request is never cut short: the plugin reads on, or closes
    try:
        while not stop.is_set() and time.monotonic() - started < NRI_SLOW_LIMIT:
            wire.send("UpdateContainer", payload)
            out.requests_sent += 1
        out.left_open += 1
    except OSError:
        out.closed_by_plugin += 1
        out.close_after.append(time.monotonic() - started)


def sync_flood(wire: NriWire, chunk: bytes, stop: threading.Event, out: NriCounts) -> None:
    """Send the chunks, each once the previous one is answered, until the plugin refuses one:
    with an error status (then it closes the session) or by closing the session."""
    taken, how = 0, "session closed at a chunk"
    try:
        for _ in range(SYNC_CHUNKS):
            if stop.is_set():
                return
            reply = wire.call("Synchronize", chunk, timeout=30)
            if reply.HasField("status") and reply.status.code:
                how = f"status {reply.status.code}, then closed"
                wire.sock.settimeout(10)
                while True:
                    wire._read()  # until the plugin closes the session
            taken += 1
        out.left_open += 1
    except TimeoutError:
        out.left_open += 1
    except OSError:
        out.closed_by_plugin += 1
        out.refusals[how] = out.refusals.get(how, 0) + 1
    finally:
        out.chunks_before_refusal.append(taken)


class NriChild(Child):
    def __init__(self, nri_socket: str, tmp: Path, log: Path, node_config: Path, code: Path = REPO) -> None:
        self.log = open(log, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child-nri", "--nri-socket", nri_socket, "--tmp", str(tmp),
             "--node-config", str(node_config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
            env={**os.environ, "PYTHONPATH": str(code), "RHP_BENCH_CODE": str(code)},
        )


NODE_CONFIG_PAUSE = 3.0  # seconds between two rewrites of the node config file


def maximal_node_config(tag: str) -> str:
    """A valid node config file just under ``MAX_NODE_CONFIG_BYTES``: a 4096-CPU cpu-topology in
    the node and the NRT annotations, the example NodeSLO, and labels (the most objects per byte)
    for the rest; ``tag`` is every label's value."""
    from koord_formats.keys import NODE_ANNOTATION_CPU_TOPOLOGY
    from koord_formats.topology import CPUInfo, CPUTopology, format_cpu_topology
    from runtime_proxy.state.nodedoc import MAX_NODE_CONFIG_BYTES, load_document

    topo = format_cpu_topology(CPUTopology(tuple(
        CPUInfo(cpu, cpu % 2048, (cpu % 2048) // 128, (cpu % 2048) // 64) for cpu in range(4096))))
    slo = load_document((REPO / "packaging/examples/nodeslo.yaml").read_text()).nodeSLO
    parts = [f"name: bench-node\nannotations:\n  {NODE_ANNOTATION_CPU_TOPOLOGY}: '{topo}'\n"
             f"nodeResourceTopology:\n  annotations:\n    {NODE_ANNOTATION_CPU_TOPOLOGY}: '{topo}'\n"
             f"nodeSLO: {json.dumps(slo)}\nlabels:\n"]
    size, i = len(parts[0]), 0
    while size + 16 < MAX_NODE_CONFIG_BYTES:
        parts.append(f"  l{i:06d}: {tag}\n")
        size += len(parts[-1])
        i += 1
    text = "".join(parts)
    load_document(text)
    return text


def node_config_rewrites(path: Path, texts: list[str], stop: threading.Event, out: NriCounts | AttackCounts) -> None:
    """Replace the node config file with the next of ``texts`` every ``NODE_CONFIG_PAUSE`` s."""
    while not stop.wait(NODE_CONFIG_PAUSE):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(texts[out.config_writes % len(texts)])
        os.replace(tmp, path)
        out.config_writes += 1


@dataclass
class NriPhase:
    name: str
    lag: dict[str, float]
    counts: NriCounts


NRI_ATTACKS = ("nri-slow", "nri-sync", "nri-nodecfg")
NRI_PHASES: list[tuple[str, frozenset[str]]] = [
    ("NRI baseline", frozenset()),
    ("never-reading runtime", frozenset({"nri-slow"})),
    ("Synchronize flood", frozenset({"nri-sync"})),
    ("node config reloads", frozenset({"nri-nodecfg"})),
]


_MAXIMAL_CONFIGS: list[str] = []


def run_nri_phase(name: str, seconds: float, attacks: frozenset[str], tmp: Path, code: Path = REPO) -> NriPhase:
    if code != REPO:
        name = f"{name} (baseline code)"
    tag = "-".join(name.split()[:2]).lower() + ("-baseline" if code != REPO else "")
    path = str(tmp / f"{tag}.sock")
    work = tmp / tag
    work.mkdir()
    node_config = work / "node.yaml"
    node_config.write_text("name: bench-node\n")
    stop = threading.Event()
    counts = NriCounts()
    threads = [threading.Thread(target=nri_runtime, args=(path, stop, attacks, counts))]
    if "nri-nodecfg" in attacks:
        if not _MAXIMAL_CONFIGS:
            _MAXIMAL_CONFIGS.extend(maximal_node_config(t) for t in "ab")
        threads.append(threading.Thread(target=node_config_rewrites,
                                        args=(node_config, _MAXIMAL_CONFIGS, stop, counts)))
    threads[0].start()
    child_proc = NriChild(path, work, tmp / f"{tag}.log", node_config, code)
    try:
        deadline = time.monotonic() + 60
        while counts.healthy_sessions < 1:  # warm up: a whole healthy session
            if time.monotonic() > deadline or child_proc.proc.poll() is not None:
                raise RuntimeError(f"the NRI plugin did not complete a healthy session in {name}")
            time.sleep(0.1)
        assert child_proc.ask("reset") == "ok"
        for t in threads[1:]:
            t.start()
        time.sleep(seconds)
        lag = json.loads(child_proc.ask("report"))
        if child_proc.proc.poll() is not None:
            raise RuntimeError(f"the NRI plugin exited during {name} (code {child_proc.proc.returncode})")
        return NriPhase(name, lag, counts)
    finally:
        stop.set()
        child_proc.stop()
        for t in threads:
            if t.is_alive():
                t.join(60)


def report_nri(phases: list[NriPhase], seconds: float) -> None:
    base = phases[0]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b > 0 else "-"

    print(f"\nNRI plugin (every built-in, loops on), {seconds:g} s per phase, probe every "
          f"{PROBE_INTERVAL * 1e3:g} ms; healthy sessions of {NRI_HEALTHY_SECONDS:g} s alternate with "
          "attacked ones; ratios against the NRI baseline row\n")
    head = (f"{'phase':<36} {'worst stall':>11} {'on CPU':>9} {'ratio':>7} {'p99 stall':>9} {'>50ms':>5} "
            f"{'peak RSS':>9} {'ratio':>6} {'lifecycle p50':>13} {'p99':>8} {'lifecycles ok':>13} {'sessions':>8}")
    print(head)
    print("-" * len(head))
    for ph in phases:
        lat = ph.counts.lifecycles.latencies
        life = f"{ph.counts.lifecycles.ok}/{ph.counts.lifecycles.ok + ph.counts.lifecycles.failed}"
        print(f"{ph.name:<36} {ph.lag['worst_ms']:>8.1f} ms {ph.lag['worst_on_cpu_ms']:>6.1f} ms "
              f"{ratio(ph.lag['worst_ms'], base.lag['worst_ms']):>7} "
              f"{ph.lag['p99_ms']:>6.1f} ms {ph.lag['over_50ms']:>5.0f} {ph.lag['hwm_mib']:>5.1f} MiB "
              f"{ratio(ph.lag['hwm_mib'], base.lag['hwm_mib']):>6} {_pct(lat, 0.5) * 1e3:>10.1f} ms "
              f"{_pct(lat, 0.99) * 1e3:>5.1f} ms {life:>13} {ph.counts.sessions:>8}")
    print(f"\ntargets: worst stall <= {STALL_TARGET_MS:g} ms, peak RSS <= {RSS_TARGET_MIB:g} MiB")
    print("(on CPU: the largest part of a stall the loop's thread spent running; the rest it waited for a CPU)")
    for ph in phases[1:]:
        c = ph.counts
        notes = [f"stall {'met' if ph.lag['worst_ms'] <= STALL_TARGET_MS else 'MISSED'} "
                 f"({ph.lag['worst_on_cpu_ms']:.1f} ms of it on the CPU)",
                 f"RSS {'met' if ph.lag['hwm_mib'] <= RSS_TARGET_MIB else 'MISSED'}",
                 f"{c.attacked} attacked sessions, {c.closed_by_plugin} closed by the plugin, {c.left_open} left open"]
        if c.lifecycles.failed:
            notes.append(f"healthy lifecycle failures {c.lifecycles.errors}")
        if c.close_after:
            notes.append(f"{c.requests_sent} requests sent unread, session closed after "
                         f"{statistics.median(c.close_after):.1f} s (median)")
        if c.config_writes:
            size = len(_MAXIMAL_CONFIGS[0].encode()) / 1024
            notes.append(f"{c.config_writes} rewrites of a valid {size:.0f} KiB node config (every "
                         f"{NODE_CONFIG_PAUSE:g} s), {ph.lag['node_config_generation'] - 1:.0f} taken")
        if c.chunks_before_refusal:
            notes.append(f"chunks of {SYNC_PODS_PER_CHUNK * SYNC_ANNOTATION / (1 << 20):.0f} MiB taken before the "
                         f"refusal {sorted(set(c.chunks_before_refusal))}, refusals {c.refusals}")
        print(f"  {ph.name}: " + "; ".join(notes))


@dataclass
class Phase:
    name: str
    lag: dict[str, float]
    version: Outcomes
    healthy: Outcomes
    poisoned: Outcomes | None
    flood: AttackCounts | None
    slow: AttackCounts | None
    rewrites: AttackCounts | None = None


ATTACKS = ("poison", "flood", "slow")
PHASES: list[tuple[str, frozenset[str]]] = [
    ("baseline", frozenset()),
    ("poisoned pods", frozenset({"poison"})),
    ("CONTINUATION flood", frozenset({"flood"})),
    ("never-reading client", frozenset({"slow"})),
    ("all attacks", frozenset(ATTACKS)),
    ("node config reloads", frozenset({"nodecfg"})),
]


def run_phase(env: Any, name: str, seconds: float, attacks: frozenset[str], tmp: Path, code: Path = REPO) -> Phase:
    if code != REPO:
        name = f"{name} (baseline code)"
    tag = name.split()[0].lower() + ("-baseline" if code != REPO else "")
    listen = str(tmp / f"{tag}.sock")
    node_config = tmp / f"{tag}-node.yaml"
    node_config.write_text("name: bench-node\n")
    child_proc = Child(listen, str(env.socket), str(tmp / "hs.d"), tmp / f"{tag}.log", node_config, code)
    env.begin_round()
    try:
        wait_ready(listen)
        # Warm up: the store is rebuilt, the loops started, every path of a pod's life taken once.
        from rhp_devenv.cri import CriClient

        with CriClient(listen, timeout=30) as cri:
            pod = cri.run_pod(cgroup_parent=env.new_cgroup_parent(), labels={LABEL_QOS_CLASS: "LS"})
            cri.run_container(pod)
            cri.remove_pod(pod)
        time.sleep(1.0)
        assert child_proc.ask("reset") == "ok"
        stop = threading.Event()
        version, healthy = Outcomes(), Outcomes()
        healthy_ann = [{ANNOTATION_RESOURCE_STATUS: json.dumps({"cpuset": "0"})}, {}]
        threads = [
            threading.Thread(target=pass_through, args=(listen, stop, version)),
            threading.Thread(target=pods, args=(env, listen, stop, healthy, healthy_ann, {LABEL_QOS_CLASS: "LS"})),
        ]
        poisoned = flood = slow = None
        if "poison" in attacks:
            poisoned = Outcomes()
            threads.append(threading.Thread(target=pods, args=(
                env, listen, stop, poisoned, list(POISONS.values()), {LABEL_QOS_CLASS: "LSR"}, POISON_PAUSE)))
        if "flood" in attacks:
            flood = AttackCounts()
            threads.append(threading.Thread(target=continuation_flood, args=(listen, stop, flood)))
        if "slow" in attacks:
            slow = AttackCounts()
            threads.append(threading.Thread(target=never_reads, args=(listen, stop, slow)))
        rewrites = None
        if "nodecfg" in attacks:
            rewrites = AttackCounts()
            if not _MAXIMAL_CONFIGS:
                _MAXIMAL_CONFIGS.extend(maximal_node_config(t) for t in "ab")
            threads.append(threading.Thread(target=node_config_rewrites,
                                            args=(node_config, _MAXIMAL_CONFIGS, stop, rewrites)))
        for t in threads:
            t.start()
        time.sleep(seconds)
        lag = json.loads(child_proc.ask("report"))
        stop.set()
        for t in threads:
            t.join(60)
        if child_proc.proc.poll() is not None:
            raise RuntimeError(f"the proxy exited during {name} (code {child_proc.proc.returncode})")
        return Phase(name, lag, version, healthy, poisoned, flood, slow, rewrites)
    finally:
        child_proc.stop()
        env.end_round()


def _pct(values: list[float], q: float) -> float:
    s = sorted(values) or [0.0]
    return s[min(len(s) - 1, int(q * len(s)))]


def report(phases: list[Phase], args: argparse.Namespace) -> None:
    base = phases[0]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b > 0 else "-"

    print(f"\ncontainerd {args.containerd}, relay transport, {args.seconds:g} s per phase, "
          f"probe every {PROBE_INTERVAL * 1e3:g} ms; ratios against the baseline row\n")
    head = (f"{'phase':<36} {'worst stall':>11} {'ratio':>7} {'p99 stall':>9} {'>50ms':>5} {'peak RSS':>9} "
            f"{'ratio':>6} {'Version p99':>11} {'Version max':>11} {'healthy ok':>10} {'poisoned ok/err':>15}")
    print(head)
    print("-" * len(head))
    for ph in phases:
        pois = f"{ph.poisoned.ok}/{ph.poisoned.failed}" if ph.poisoned else "-"
        v99, vmax = _pct(ph.version.latencies, 0.99), max(ph.version.latencies or [0.0])
        healthy = f"{ph.healthy.ok}/{ph.healthy.ok + ph.healthy.failed}"
        print(f"{ph.name:<36} {ph.lag['worst_ms']:>8.1f} ms {ratio(ph.lag['worst_ms'], base.lag['worst_ms']):>7} "
              f"{ph.lag['p99_ms']:>6.1f} ms {ph.lag['over_50ms']:>5.0f} {ph.lag['hwm_mib']:>5.1f} MiB "
              f"{ratio(ph.lag['hwm_mib'], base.lag['hwm_mib']):>6} {v99 * 1e3:>8.1f} ms {vmax * 1e3:>8.1f} ms "
              f"{healthy:>10} {pois:>15}")
    print(f"\ntargets: worst stall <= {STALL_TARGET_MS:g} ms, peak RSS <= {RSS_TARGET_MIB:g} MiB")
    for ph in phases[1:]:
        stall_ok = ph.lag["worst_ms"] <= STALL_TARGET_MS
        rss_ok = ph.lag["hwm_mib"] <= RSS_TARGET_MIB
        notes = [f"stall {'met' if stall_ok else 'MISSED'}", f"RSS {'met' if rss_ok else 'MISSED'}"]
        if ph.healthy.failed:
            notes.append(f"healthy pod failures {ph.healthy.errors}")
        if ph.version.failed:
            notes.append(f"Version failures {ph.version.errors}")
        if ph.poisoned is not None:
            notes.append(f"poisoned pods: {ph.poisoned.ok} started, {ph.poisoned.failed} refused "
                         f"{ph.poisoned.errors or ''}".rstrip())
        if ph.flood is not None:
            notes.append(f"flood: {ph.flood.connections} connections, {ph.flood.sent_mib:.0f} MiB sent, "
                         f"{ph.flood.closed_by_proxy} ended by the proxy")
        if ph.rewrites is not None:
            notes.append(f"{ph.rewrites.config_writes} rewrites of a valid "
                         f"{len(_MAXIMAL_CONFIGS[0].encode()) / 1024:.0f} KiB node config (every "
                         f"{NODE_CONFIG_PAUSE:g} s), {ph.lag['node_config_generation'] - 1:.0f} taken")
        if ph.slow is not None:
            notes.append(f"never-reading client: {ph.slow.streams} streams sent, "
                         f"{'ended by the proxy' if ph.slow.closed_by_proxy else 'connection left open'}")
        print(f"  {ph.name}: " + "; ".join(notes))
    base_median = statistics.median(base.healthy.latencies) if base.healthy.latencies else 0.0
    medians = ", ".join(
        f"{ph.name} {statistics.median(ph.healthy.latencies) * 1e3:.0f} ms" for ph in phases if ph.healthy.latencies
    )
    print(f"healthy pod (run + create + start + remove) p50: {medians} (baseline {base_median * 1e3:.0f} ms)")
    print(f"poisons: {', '.join(POISONS)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--containerd", default="1.6")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    parser.add_argument("--quick", action="store_true", help="8 s per phase")
    parser.add_argument("--only", help="baseline and one attack phase: poison, flood, slow, nodecfg or "
                        "poison,flood,slow; nri-slow, nri-sync or nri-nodecfg (the NRI baseline and that "
                        "attack), nri (all three)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the proxies' logs")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--listen", help=argparse.SUPPRESS)
    parser.add_argument("--backend", help=argparse.SUPPRESS)
    parser.add_argument("--hook-server-dir", help=argparse.SUPPRESS)
    parser.add_argument("--child-nri", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--nri-socket", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    parser.add_argument("--node-config", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-repo", type=Path,
                        help="run each phase first with the proxy or plugin of this checkout (rows marked "
                             "'baseline code'), then with this one's, interleaved in one run")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if args.child_nri:
        nri_child(args)
        return
    if args.quick:
        args.seconds = 8.0
    only = None if args.only is None else frozenset(args.only.split(","))
    nri_only = None if only is None else (frozenset(NRI_ATTACKS) if only == {"nri"} else only & set(NRI_ATTACKS))
    with tempfile.TemporaryDirectory(prefix="rhp-hostile-") as tmp:
        if only is None or not nri_only:
            from rhp_devenv.env import ContainerdEnv

            with ContainerdEnv.start(args.containerd) as env:
                codes = [args.baseline_repo.resolve(), REPO] if args.baseline_repo else [REPO]
                phases = [run_phase(env, name, args.seconds, attacks, Path(tmp), code)
                          for name, attacks in PHASES if only is None or name == "baseline" or attacks == only
                          for code in codes]
            report(phases, args)
        if only is None or nri_only:
            codes = [args.baseline_repo.resolve(), REPO] if args.baseline_repo else [REPO]
            nri_phases = [run_nri_phase(name, args.seconds, attacks, Path(tmp), code)
                          for name, attacks in NRI_PHASES if nri_only is None or not attacks or attacks <= nri_only
                          for code in codes]
            report_nri(nri_phases, args.seconds)
        if args.keep_logs:
            kept = Path(tempfile.mkdtemp(prefix="rhp-hostile-logs-"))
            for log in Path(tmp).glob("*.log"):
                log.rename(kept / log.name)
            print(f"proxy logs: {kept}")


if __name__ == "__main__":
    main()
