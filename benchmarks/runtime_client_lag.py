"""How long ``RuntimeClient`` holds the event loop while it fetches and decodes a large
ListContainers answer (issue 35: nothing may hold the loop more than 50 ms).

A CRI server in another process (the tests' in-process HTTP/2 server, ``tests/runtime_proxy/
runtime/h2_server.py``) answers ListContainers with ``--containers`` containers (31,000 make
about 16 MiB, the client's bound); the client's process runs a ticker every millisecond and
reports the longest gap between two ticks during each call (wall time, and the thread's CPU
time, which other processes on a loaded machine do not inflate), and the call's time.

    .venv/bin/python benchmarks/runtime_client_lag.py --containers 31000 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cri_protos import api_pb2  # noqa: E402


def _answer(containers: int) -> bytes:
    resp = api_pb2.ListContainersResponse()
    for i in range(containers):
        c = resp.containers.add(id=f"{i:064x}", pod_sandbox_id=f"{i // 2:064x}", image_ref="sha256:" + "a" * 64,
                                created_at=i)
        c.metadata.name = f"app-{i}"
        c.image.image = "docker.io/library/busybox:latest"
        c.labels.update({"io.kubernetes.pod.name": f"pod-{i // 2}", "io.kubernetes.pod.namespace": "default",
                         "io.kubernetes.pod.uid": "u" * 36, "io.kubernetes.container.name": "app"})
        c.annotations.update({"io.kubernetes.container.hash": "abcd", "io.kubernetes.container.restartCount": "0"})
    return resp.SerializeToString()


async def _serve(path: str, containers: int) -> None:
    from tests.runtime_proxy.runtime.h2_server import Server, Stream

    data = _answer(containers)

    async def handler(s: Stream) -> None:
        await s.answer(data)

    server = Server(path, handler)
    await server.start()
    print("ready", len(data), flush=True)
    await asyncio.Event().wait()


async def _measure(path: str, rounds: int) -> list[tuple[float, float, float]]:
    from runtime_proxy.runtime.client import RuntimeClient

    client = RuntimeClient(path, timeout=120)
    out = []
    for _ in range(rounds):
        longest = longest_cpu = 0.0
        done = asyncio.Event()

        async def ticker(done: asyncio.Event) -> None:
            nonlocal longest, longest_cpu
            last, last_cpu = time.perf_counter(), time.thread_time()
            while not done.is_set():
                await asyncio.sleep(0.001)
                now, now_cpu = time.perf_counter(), time.thread_time()
                longest, longest_cpu = max(longest, now - last), max(longest_cpu, now_cpu - last_cpu)
                last, last_cpu = now, now_cpu

        tick = asyncio.create_task(ticker(done))
        started = time.perf_counter()
        listed = await client.list_containers()
        took = time.perf_counter() - started
        done.set()
        await tick
        out.append((longest * 1000, longest_cpu * 1000, took * 1000))
        print(f"  {len(listed)} containers in {took * 1000:.0f} ms, longest loop gap {longest * 1000:.1f} ms "
              f"wall, {longest_cpu * 1000:.1f} ms CPU", flush=True)
    await client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containers", type=int, default=31_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve, args.containers))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "cri.sock")
        server = subprocess.Popen([sys.executable, __file__, "--serve", path, "--containers", str(args.containers)],
                                  stdout=subprocess.PIPE, text=True, cwd=REPO)
        try:
            assert server.stdout is not None
            size = int(server.stdout.readline().split()[1])
            print(f"ListContainers answer: {args.containers} containers, {size / (1 << 20):.1f} MiB")
            results = asyncio.run(_measure(path, args.rounds))
        finally:
            server.kill()
            server.wait()
    gaps, cpu = [g for g, _, _ in results], [c for _, c, _ in results]
    print(f"longest loop gap: wall median {statistics.median(gaps):.1f} ms, max {max(gaps):.1f} ms; "
          f"CPU median {statistics.median(cpu):.1f} ms, max {max(cpu):.1f} ms; "
          f"call median {statistics.median(t for _, _, t in results):.0f} ms")


if __name__ == "__main__":
    main()
