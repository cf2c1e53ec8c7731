"""``python -m rhp_devenv.demo``: the whole node side on this machine, end to end.

Called by ``scripts/demo.sh`` (the README's first command) after it installed what is missing.
It starts a private containerd, builds and imports a small busybox image offline, starts the
proxy in front of containerd with every built-in plugin, then runs three pods through the
proxy as kubelet would (an LSR pod bound to CPU 0 by the scheduler's resource-status
annotation, an LS pod, and a BE pod with batch resources), and prints what the hooks changed
and the cgroup files where to see it. Everything is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from runtime_proxy.commands.serve import Proxy, ProxyOptions
from runtime_proxy.config import ProxyConfig

_PODS: list[dict[str, Any]] = [
    {
        "name": "web-lsr",
        "qos": "burstable",
        "labels": {"koordinator.sh/qosClass": "LSR"},
        "annotations": {"scheduling.koordinator.sh/resource-status": json.dumps({"cpuset": "0"})},
        "resources": {"cpu_shares": 1024, "cpu_quota": 100000, "cpu_period": 100000},
    },
    {
        "name": "api-ls",
        "qos": "burstable",
        "labels": {"koordinator.sh/qosClass": "LS"},
        "annotations": {},
        "resources": {"cpu_shares": 512, "cpu_quota": 50000, "cpu_period": 100000},
    },
    {
        "name": "batch-be",
        "qos": "besteffort",
        "labels": {"koordinator.sh/qosClass": "BE"},
        "annotations": {
            "node.koordinator.sh/extended-resource-spec": json.dumps(
                {
                    "containers": {
                        "main": {
                            "requests": {"kubernetes.io/batch-cpu": "500"},
                            "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "256Mi"},
                        }
                    }
                }
            )
        },
        "resources": {"cpu_shares": 2},
    },
]

_FILES = [
    ("cpuset", "cpuset.cpus"),
    ("cpu", "cpu.shares"),
    ("cpu", "cpu.cfs_quota_us"),
    ("memory", "memory.limit_in_bytes"),
]


def _run_pods(socket: str, version: str, top: str) -> list[dict[str, Any]]:
    from rhp_devenv.cgroupfs import container_cgroup_dir, pod_cgroup_parent
    from rhp_devenv.cri import CriClient, container_config, linux_resources

    results: list[dict[str, Any]] = []
    with CriClient(socket) as client:
        for spec in _PODS:
            import uuid

            uid = str(uuid.uuid4())
            parent = pod_cgroup_parent(top, spec["qos"], uid)
            pod = client.run_pod(
                cgroup_parent=parent, labels=spec["labels"], annotations=spec["annotations"],
                name=spec["name"], uid=uid,
            )
            sent = linux_resources(**spec["resources"])
            config = container_config(name="main", resources=sent)
            cid = client.create_container(pod.pod_id, config, pod.config)
            client.start_container(cid)
            files = {}
            for controller, name in _FILES:
                path = container_cgroup_dir(parent, cid, controller) / name
                try:
                    files[str(path)] = path.read_text().strip()
                except OSError as exc:
                    files[str(path)] = f"<{exc.strerror}>"
            results.append({"pod": spec["name"], "labels": spec["labels"], "sent": spec["resources"],
                            "files": files, "pod_id": pod.pod_id})
        for r in results:
            client.remove_pod(r["pod_id"])
    return results


async def _demo(version: str, transport: str) -> int:
    from rhp_devenv import PrivateContainerd, remove_cgroup_tree

    top = f"/rhp-demo-{Path(tempfile.mktemp()).name[-6:]}"
    with PrivateContainerd(version) as ctrd, tempfile.TemporaryDirectory(prefix="rhp-demo-") as tmp:
        listen = str(Path(tmp) / "proxy.sock")
        print(f"containerd {ctrd.binary_version()} running privately at {ctrd.socket}")
        proxy = Proxy(ProxyOptions(listen=listen, backend=str(ctrd.socket), config=ProxyConfig(),
                                   transport=transport, hook_servers=False, reconcile=False, grace=2.0))
        await proxy.start()
        await asyncio.wait_for(proxy.ready.wait(), 20)
        print(f"runtime-proxy ({transport} transport) serving CRI at {listen} with plugins: "
              f"{', '.join(step.name for step in proxy.pipeline.steps)}\n")
        try:
            results = await asyncio.to_thread(_run_pods, listen, version, top)
        finally:
            await proxy.stop()
            remove_cgroup_tree(top)
    for r in results:
        print(f"pod {r['pod']}  labels={r['labels']}")
        print(f"  kubelet sent:       {r['sent']}")
        print("  after the hooks, on the host:")
        for path, value in r["files"].items():
            print(f"    {path} = {value}")
        print()
    print("Run `runtime-proxy plan` on a JSON document to see a plan without running anything "
          "(docs/planner.md).")
    return 0


def main(argv: list[str] | None = None) -> int:
    from rhp_devenv import available_versions

    parser = argparse.ArgumentParser(prog="python -m rhp_devenv.demo")
    versions = available_versions()
    parser.add_argument("--containerd", default=versions[-1] if versions else "1.6", choices=versions or ["1.6"])
    parser.add_argument("--transport", default="relay", choices=("relay", "grpc"))
    args = parser.parse_args(argv)
    return asyncio.run(_demo(args.containerd, args.transport))


if __name__ == "__main__":
    import sys

    from runtime_proxy import logs

    logs.configure("console", "warning")
    sys.exit(main(sys.argv[1:]))
