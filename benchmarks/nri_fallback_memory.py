"""The NRI plugin's memory before and after its CRI fallback client is used: ``runtime-proxy
nri``'s composition (``runtime_proxy.commands.nri.build``, every sub-command's parser built),
then the client the fallback makes (``_runtime_for_updates``) sending ``--updates``
UpdateContainerResources and one ListContainers to a CRI server in another process (the tests'
HTTP/2 server, ``benchmarks/runtime_client_lag.py --serve``, answering ``--containers``).

    .venv/bin/python benchmarks/nri_fallback_memory.py --rounds 3 [--baseline NAME=TREE]

Each round runs a fresh child per arm, in alternating order; VmRSS from /proc after the
composition and after the calls, and whether the gRPC library was loaded. Speed is not measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import baseline  # noqa: E402

_CHILD = """
import asyncio, json, sys
from pathlib import Path

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

async def main(tmp, backend, updates):
    import runtime_proxy.cli
    from hooks.plan import ResourceChanges
    from runtime_proxy.commands import nri
    from runtime_proxy.config import ProxyConfig
    runtime_proxy.cli.build_parser()
    (tmp / "hooks").mkdir()
    config = ProxyConfig(hookServerDir=str(tmp / "hooks"), cgroupRoot=str(tmp), usageLoop={"enable": True})
    opts = nri.NriOptions(socket=str(tmp / "nri.sock"), backend=backend, config=config, entry_points=False)
    nri.build(opts)
    out = {"composed": rss()}
    client = nri._runtime_for_updates(opts, None)()
    for i in range(updates):
        await client.update_changed_resources(f"c{i}", ResourceChanges(cpu_shares=2 + i))
    await client.list_containers()
    out["after the calls"] = rss()
    out["grpc"] = "grpc" in sys.modules
    await client.close()
    print(json.dumps(out))

asyncio.run(main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
"""


def _arm(prefix: list[str], cwd: Path, backend: str, updates: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([*prefix, sys.executable, "-c", _CHILD, tmp, backend, str(updates)], cwd=cwd,
                             capture_output=True, text=True, timeout=300, check=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--containers", type=int, default=200)
    baseline.add_option(parser)
    args = parser.parse_args()
    arms: list[tuple[str, list[str], Path]] = [("ours", baseline.Baseline("ours", REPO).wrapper(), REPO)]
    if args.baseline is not None:
        arms.append((args.baseline.name, args.baseline.wrapper(), args.baseline.tree))
    with tempfile.TemporaryDirectory() as tmp:
        backend = str(Path(tmp) / "cri.sock")
        server = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "runtime_client_lag.py"), "--serve",
                                   backend, "--containers", str(args.containers)], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            server.stdout.readline()
            time.sleep(0.2)
            for n, order in baseline.orders(arms, args.rounds):
                for name, prefix, tree in order:
                    print(f"round {n} {name}: {json.dumps(_arm(prefix, tree, backend, args.updates))}", flush=True)
        finally:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
