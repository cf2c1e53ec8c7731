"""kubelet v1.34 in the cgroup v2 guest with ``cgroupDriver: systemd``, joined to a control plane
on the host through one QEMU forward (``restrict=on``, 10.0.2.100:6443 -> 127.0.0.1 only), runs a
pod; the guest reaches no other address (issue 33, item 3; ``rhp_devenv.v2kubelet``).

Under emulation this takes minutes (docs/v2-node.md), so it runs only on request:
``RHP_V2_KUBELET=1 bash scripts/test.sh tests/v2/test_v2_kubelet.py``. It boots a guest of its
own (the tier's shared guest has no network device at all).
"""

from __future__ import annotations

import json
import os
import time

import pytest
from rhp_devenv.kube import Cluster
from rhp_devenv.v2kubelet import API_GUEST_PORT, NODE, GuestKubelet
from rhp_devenv.v2node import GUEST_FORWARD_ADDRESS, V2Node, build

from tests.v2.conftest import REPO
from tests.v2.report import REPORT

pytestmark = pytest.mark.skipif(os.environ.get("RHP_V2_KUBELET") != "1",
                                reason="kubelet in the emulated guest takes minutes: run with RHP_V2_KUBELET=1")

IMPORT = ("from pathlib import Path\n"
          "from rhp_devenv.image import build_image_archive, import_image\n"
          "a = build_image_archive(Path('/run/rhp-busybox.tar'))\n"
          "import_image(Path('/opt/runtime-hook-proxy/containerd/2.1/usr/bin/ctr'),"
          " Path('/run/containerd/containerd.sock'), a.archive, timeout=300)\n"
          "print(a.name)\n")


def test_kubelet_in_the_guest_runs_a_pod() -> None:
    times: dict[str, float] = {}
    t0 = time.monotonic()
    with Cluster("/nonexistent.sock", kubelet=False) as cluster:
        times["control plane"] = round(time.monotonic() - t0, 1)
        api = cluster.ports["apiserver"]
        with V2Node(REPO, build_dir=build(REPO), forwards=[(API_GUEST_PORT, api)]) as node:
            times["guest booted"] = round(time.monotonic() - t0, 1)
            assert "restrict=on" in " ".join(node.command(node.build_dir or REPO))
            (node.share / "import.py").write_text(IMPORT)
            image = node.run(node.python("/mnt/xfer/import.py"), timeout=600, check=True).stdout.split()[-1]
            kubelet = GuestKubelet(node, cluster)
            try:
                kubelet.start()
            except Exception:
                print(kubelet.log())
                raise
            times.update({k: round(v + times["guest booted"], 1) for k, v in kubelet.timings.items()})
            # only the forward: the host's API server port is not reachable at the host's address
            probe = node.run(f"busybox nc -w 5 {GUEST_FORWARD_ADDRESS} {API_GUEST_PORT} </dev/null; echo fwd=$?; "
                             f"busybox nc -w 5 10.0.2.2 {api} </dev/null; echo host=$?", timeout=120)
            # (no probe of an outside address: restrict=on would drop it inside QEMU, but a test
            # never aims a packet past loopback)
            assert "fwd=0" in probe.stdout and "host=0" not in probe.stdout, probe
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "v2-ls", "namespace": "default",
                                                                  "labels": {"koordinator.sh/qosClass": "LS"}},
                   "spec": {"nodeName": NODE, "hostNetwork": True, "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                            "command": ["sleep", "3600"],
                                            "resources": {"requests": {"cpu": "100m", "memory": "32Mi"},
                                                          "limits": {"cpu": "200m", "memory": "64Mi"}}}]}}
            cluster.apply(pod)
            cluster.wait_for(lambda: (cluster.get_json("pod", "v2-ls", namespace="default") or {})
                             .get("status", {}).get("phase") == "Running", what="pod v2-ls Running",
                             timeout=600)
            times["pod Running"] = round(time.monotonic() - t0, 1)
            print(times)
            uid = json.loads(cluster.kubectl("get", "pod", "v2-ls", "-o", "json").stdout)["metadata"]["uid"]
            slice_dir = ("/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/"
                         f"kubepods-burstable-pod{uid.replace('-', '_')}.slice")
            scope = f"{slice_dir}/cri-containerd-*.scope"
            # the container's scope (the sandbox's has no limits), read back from the guest's kernel
            got = node.run(f"for d in {scope}; do echo $(cat $d/memory.max) $(cat $d/cpu.max); done",
                           timeout=120, check=True).stdout.splitlines()
            assert f"{64 * 1024**2} 20000 100000" in got, got
    REPORT.append(f"kubelet in the v2 guest (seconds from the start): {times}")
    print(times)
