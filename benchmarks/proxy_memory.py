"""Proxy memory over a node's life: RSS at start, with 200 containers, and over many pod lifecycles,
for our proxy (every built-in plugin, the default configuration) and Koordinator's
koord-runtime-proxy v1.8.0, side by side against one stateful in-memory CRI runtime.

    .venv/bin/python benchmarks/proxy_memory.py [--lifecycles 10000] [--every 1000]
        [--baseline NAME=TREE ...] [--koord PATH | --no-koord] [--no-node-venv]

The runtime is a gRPC server in this process (``FakeRuntime``) that keeps pods and containers and
answers CRI's RuntimeService as containerd would for what the proxies call: ids from RunPodSandbox
and CreateContainer, states through Start/Stop/Remove, List* and *Status from its tables, an empty
answer to anything else. A real containerd would spend minutes of the shared machine's CPU on
10,000 pod lifecycles (about 300 ms each); the proxies' own memory does not depend on who answers.
Our proxy runs as ``runtime-proxy serve`` with a private, empty cgroup root (its plugins plan and
log; their cgroup writes are skipped for the missing directories), no hook servers.
Arm ``ours`` runs on the development venv's python, which also holds the dev extra; arm
``ours-node`` runs the same tree on the node package's venv (``benchmarks/node_venv.py``: exactly
``packaging/deb/requirements.txt`` on Debian's python3, built once), which is what a node runs.
``--baseline NAME=TREE`` adds our proxy from another source tree (``git worktree add /tmp/base
COMMIT``), so a change's before and after are measured in one run. koord-runtime-proxy runs in its
containerd mode with no hook server (see ``benchmarks/proxy_overhead.py``); skipped with the
reason when it is not built.

Phases, each arm driven in turn (a pod lifecycle through each arm, then the next):
  1. start: RSS once every arm answers Version;
  2. 200 containers: 20 pods of 10 running containers each, created through each arm;
  3. lifecycles: RunPodSandbox, CreateContainer, StartContainer, StopContainer, RemoveContainer,
     StopPodSandbox, RemovePodSandbox, ``--lifecycles`` times, RSS every ``--every``.
RSS is VmRSS from /proc; the peak (VmHWM) is printed too. Speed is not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
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

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks" / "transport"), str(REPO / "benchmarks")]

from cri_protos import api_pb2  # noqa: E402
from tests.integration.harness import wait_for_socket  # noqa: E402

SERVICE = "/runtime.v1.RuntimeService/"
QOS = "koordinator.sh/qosClass"


class FakeRuntime:
    """CRI's RuntimeService in memory, enough for a proxy's store and plugins."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, tuple[api_pb2.PodSandboxConfig, Any]] = {}
        self.containers: dict[str, tuple[str, api_pb2.ContainerConfig, Any]] = {}

    def answer(self, method: str, body: bytes) -> bytes:
        name = method.rsplit("/", 1)[-1]
        handler: Callable[[bytes], Any] | None = getattr(self, f"do_{name}", None)
        return b"" if handler is None else handler(body).SerializeToString()

    def do_Version(self, body: bytes) -> Any:
        return api_pb2.VersionResponse(version="0.1.0", runtime_name="fake", runtime_version="1.0",
                                       runtime_api_version="v1")  # fmt: skip

    def do_RunPodSandbox(self, body: bytes) -> Any:
        req = api_pb2.RunPodSandboxRequest.FromString(body)
        sid = uuid.uuid4().hex * 2
        self.sandboxes[sid] = (req.config, api_pb2.SANDBOX_READY)
        return api_pb2.RunPodSandboxResponse(pod_sandbox_id=sid)

    def do_StopPodSandbox(self, body: bytes) -> Any:
        sid = api_pb2.StopPodSandboxRequest.FromString(body).pod_sandbox_id
        if sid in self.sandboxes:
            self.sandboxes[sid] = (self.sandboxes[sid][0], api_pb2.SANDBOX_NOTREADY)
        return api_pb2.StopPodSandboxResponse()

    def do_RemovePodSandbox(self, body: bytes) -> Any:
        sid = api_pb2.RemovePodSandboxRequest.FromString(body).pod_sandbox_id
        self.sandboxes.pop(sid, None)
        for cid in [c for c, (s, _, _) in self.containers.items() if s == sid]:
            del self.containers[cid]
        return api_pb2.RemovePodSandboxResponse()

    def _sandbox(self, sid: str) -> api_pb2.PodSandbox:
        config, state = self.sandboxes[sid]
        return api_pb2.PodSandbox(id=sid, metadata=config.metadata, state=state, created_at=1,
                                  labels=config.labels, annotations=config.annotations)  # fmt: skip

    def do_PodSandboxStatus(self, body: bytes) -> Any:
        sid = api_pb2.PodSandboxStatusRequest.FromString(body).pod_sandbox_id
        if sid not in self.sandboxes:
            return api_pb2.PodSandboxStatusResponse()
        config, state = self.sandboxes[sid]
        status = api_pb2.PodSandboxStatus(id=sid, metadata=config.metadata, state=state, created_at=1,
                                          labels=config.labels, annotations=config.annotations)  # fmt: skip
        return api_pb2.PodSandboxStatusResponse(status=status)

    def do_ListPodSandbox(self, body: bytes) -> Any:
        return api_pb2.ListPodSandboxResponse(items=[self._sandbox(s) for s in self.sandboxes])

    def do_CreateContainer(self, body: bytes) -> Any:
        req = api_pb2.CreateContainerRequest.FromString(body)
        cid = uuid.uuid4().hex * 2
        self.containers[cid] = (req.pod_sandbox_id, req.config, api_pb2.CONTAINER_CREATED)
        return api_pb2.CreateContainerResponse(container_id=cid)

    def _set(self, cid: str, state: Any) -> None:
        if cid in self.containers:
            sid, config, _ = self.containers[cid]
            self.containers[cid] = (sid, config, state)

    def do_StartContainer(self, body: bytes) -> Any:
        self._set(api_pb2.StartContainerRequest.FromString(body).container_id, api_pb2.CONTAINER_RUNNING)
        return api_pb2.StartContainerResponse()

    def do_StopContainer(self, body: bytes) -> Any:
        self._set(api_pb2.StopContainerRequest.FromString(body).container_id, api_pb2.CONTAINER_EXITED)
        return api_pb2.StopContainerResponse()

    def do_RemoveContainer(self, body: bytes) -> Any:
        self.containers.pop(api_pb2.RemoveContainerRequest.FromString(body).container_id, None)
        return api_pb2.RemoveContainerResponse()

    def _container(self, cid: str) -> api_pb2.Container:
        sid, config, state = self.containers[cid]
        return api_pb2.Container(id=cid, pod_sandbox_id=sid, metadata=config.metadata, image=config.image,
                                 image_ref=config.image.image, state=state, created_at=1, labels=config.labels,
                                 annotations=config.annotations)  # fmt: skip

    def do_ListContainers(self, body: bytes) -> Any:
        return api_pb2.ListContainersResponse(containers=[self._container(c) for c in self.containers])

    def do_ContainerStatus(self, body: bytes) -> Any:
        cid = api_pb2.ContainerStatusRequest.FromString(body).container_id
        if cid not in self.containers:
            return api_pb2.ContainerStatusResponse()
        _sid, config, state = self.containers[cid]
        status = api_pb2.ContainerStatus(id=cid, metadata=config.metadata, state=state, created_at=1,
                                         image=config.image, image_ref=config.image.image, labels=config.labels,
                                         annotations=config.annotations)  # fmt: skip
        return api_pb2.ContainerStatusResponse(status=status)


async def _serve(runtime: FakeRuntime, path: str) -> Any:
    server = grpc.aio.server()

    class Generic(grpc.GenericRpcHandler):  # type: ignore[misc]
        def service(self, details: Any) -> Any:
            method = details.method

            async def answer(request: bytes, context: Any) -> bytes:
                return runtime.answer(method, request)

            return grpc.unary_unary_rpc_method_handler(answer)

    server.add_generic_rpc_handlers((Generic(),))
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


class Driver:
    """CRI calls to one proxy's socket, the way kubelet makes them."""

    def __init__(self, path: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{path}")

    def call(self, name: str, request: Any, response: Any) -> Any:
        fn = self.channel.unary_unary(SERVICE + name, request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=response.FromString)  # fmt: skip
        return fn(request, timeout=30)

    def run_pod(self, n: int) -> tuple[str, api_pb2.PodSandboxConfig]:
        uid = str(uuid.uuid4())
        config = api_pb2.PodSandboxConfig()
        config.metadata.name, config.metadata.namespace, config.metadata.uid = f"pod-{n}", "bench", uid
        config.labels[QOS] = ("LS", "BE", "LSR")[n % 3]
        config.labels["io.kubernetes.pod.name"] = f"pod-{n}"
        config.annotations["node.koordinator.sh/gpu-isolation"] = "false"
        if n % 3 == 2:
            config.annotations["scheduling.koordinator.sh/resource-status"] = json.dumps({"cpuset": "0"})
        config.linux.cgroup_parent = f"/kubepods/burstable/pod{uid}"
        sid = self.call("RunPodSandbox", api_pb2.RunPodSandboxRequest(config=config),
                        api_pb2.RunPodSandboxResponse).pod_sandbox_id  # fmt: skip
        return sid, config

    def create(self, sid: str, pod: api_pb2.PodSandboxConfig, i: int, start: bool) -> str:
        config = api_pb2.ContainerConfig()
        config.metadata.name = f"app-{i}"
        config.image.image = "registry.local/app:1.0"
        config.labels["io.kubernetes.container.name"] = f"app-{i}"
        config.linux.resources.cpu_shares = 512
        config.linux.resources.cpu_quota = 50000
        config.linux.resources.cpu_period = 100000
        config.linux.resources.memory_limit_in_bytes = 256 << 20
        req = api_pb2.CreateContainerRequest(pod_sandbox_id=sid, config=config, sandbox_config=pod)
        cid = self.call("CreateContainer", req, api_pb2.CreateContainerResponse).container_id
        if start:
            self.call("StartContainer", api_pb2.StartContainerRequest(container_id=cid),
                      api_pb2.StartContainerResponse)  # fmt: skip
        return str(cid)

    def lifecycle(self, n: int) -> None:
        sid, pod = self.run_pod(n)
        cid = self.create(sid, pod, 0, True)
        self.call("StopContainer", api_pb2.StopContainerRequest(container_id=cid, timeout=0),
                  api_pb2.StopContainerResponse)  # fmt: skip
        self.call("RemoveContainer", api_pb2.RemoveContainerRequest(container_id=cid), api_pb2.RemoveContainerResponse)
        self.call("StopPodSandbox", api_pb2.StopPodSandboxRequest(pod_sandbox_id=sid), api_pb2.StopPodSandboxResponse)
        self.call("RemovePodSandbox", api_pb2.RemovePodSandboxRequest(pod_sandbox_id=sid),
                  api_pb2.RemovePodSandboxResponse)  # fmt: skip


def status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def start_ours(tree: Path, listen: str, backend: str, tmp: Path, name: str,
               python: str = sys.executable) -> subprocess.Popen[bytes]:
    cg = tmp / f"cg-{name}"
    cg.mkdir()
    log = open(tmp / f"{name}.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [python, "-m", "runtime_proxy.cli", "--log-format", "json", "--log-level", "warning", "serve",
         "--listen", listen, "--backend", backend, "--hook-server-dir", str(tmp / f"hs-{name}.d"),
         "--cgroup-root", str(cg)],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    wait_for_socket(listen, 120, exited=lambda: "" if proc.poll() is None else f"exit status {proc.returncode}")
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lifecycles", type=int, default=10000)
    parser.add_argument("--every", type=int, default=1000, help="RSS every this many lifecycles")
    parser.add_argument("--baseline", action="append", default=[], metavar="NAME=TREE",
                        help="also run our proxy from source tree TREE as arm NAME (repeatable)")  # fmt: skip
    parser.add_argument("--koord", help="koord-runtime-proxy binary (default: scripts/build-koord.sh's cached one)")
    parser.add_argument("--no-koord", action="store_true")
    parser.add_argument("--no-node-venv", action="store_true",
                        help="leave out arm ours-node (our proxy on the node package's venv)")  # fmt: skip
    args = parser.parse_args()

    import run as transport  # type: ignore[import-not-found]  # benchmarks/transport/run.py

    trees = {"ours": REPO, **{n: Path(t).resolve() for n, t in (b.split("=", 1) for b in args.baseline)}}
    pythons = {n: sys.executable for n in trees}
    if not args.no_node_venv:
        import node_venv  # type: ignore[import-not-found]  # benchmarks/node_venv.py

        try:
            pythons["ours-node"] = str(node_venv.ensure())
            trees["ours-node"] = REPO
        except (RuntimeError, OSError, subprocess.CalledProcessError) as err:
            print(f"ours-node arm skipped: {err}")
    koord: Path | None = None
    if not args.no_koord:
        koord, why = transport.koord_binary(args.koord)
        if koord is None:
            print(f"koord-runtime-proxy arm skipped: {why}")
    made_hook_dir = koord is not None and not transport.KOORD_HOOK_DIR.exists()
    tmp = Path(tempfile.mkdtemp(prefix="rhp-mem-"))
    runtime = FakeRuntime()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    backend = str(tmp / "runtime.sock")
    server = asyncio.run_coroutine_threadsafe(_serve(runtime, backend), loop).result(10)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    rows: dict[str, list[tuple[str, float]]] = {}
    try:
        for name, tree in trees.items():
            procs[name] = start_ours(tree, str(tmp / f"{name}.sock"), backend, tmp, name, pythons[name])
        if koord is not None:
            procs["koord-runtime-proxy"] = transport.start_koord(koord, str(tmp / "koord.sock"), backend,
                                                                 str(tmp / "koord.log"))  # fmt: skip
            wait_for_socket(str(tmp / "koord.sock"), 60)
        socks = {n: str(tmp / ("koord.sock" if n == "koord-runtime-proxy" else f"{n}.sock")) for n in procs}
        drivers = {n: Driver(s) for n, s in socks.items()}

        def sample(label: str) -> None:
            for n, p in procs.items():
                rows.setdefault(n, []).append((label, status_kib(p.pid, "VmRSS") / 1024))
            print(f"{label:>28}: " + "  ".join(f"{n} {rows[n][-1][1]:.1f} MiB" for n in procs), flush=True)

        time.sleep(2)  # the loops' first rounds
        sample("start")
        for n in range(20):
            for d in drivers.values():
                sid, pod = d.run_pod(n)
                for i in range(10):
                    d.create(sid, pod, i, True)
        time.sleep(2)
        sample("200 containers")
        t0 = time.monotonic()
        for k in range(1, args.lifecycles + 1):
            for d in drivers.values():
                d.lifecycle(1000 + k)
            if k % args.every == 0 or k == args.lifecycles:
                sample(f"{k} lifecycles, {time.monotonic() - t0:.0f} s")
        peaks = {n: status_kib(p.pid, "VmHWM") / 1024 for n, p in procs.items()}
        cpu = {n: _cpu_s(p.pid) for n, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        asyncio.run_coroutine_threadsafe(server.stop(None), loop).result(10)
        shutil.rmtree(tmp, ignore_errors=True)
        if made_hook_dir:
            shutil.rmtree(transport.KOORD_HOOK_DIR, ignore_errors=True)
    names = list(rows)
    print("\n| RSS, MiB | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for i, (label, _) in enumerate(rows[names[0]]):
        print(f"| {label.split(',')[0]} | " + " | ".join(f"{rows[n][i][1]:.1f}" for n in names) + " |")
    print("| peak (VmHWM) | " + " | ".join(f"{peaks[n]:.1f}" for n in names) + " |")
    print("| CPU over the run, s | " + " | ".join(f"{cpu[n]:.1f}" for n in names) + " |")
    return 0


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
