"""kubelet's ``--cgroup-root`` with ``runtime-proxy nri`` on real containerd 2.1 and 1.7: pods are
made directly on containerd as a kubelet with ``cgroupRoot: /rhp-root-<random>`` makes them (the
QoS dirs first), the plugin runs as a child process with the usage loop on, and CPU suppress's BE
kube-QoS quota lands in ``<root>/kubepods/besteffort``: learned from the cgroup parents NRI
reports, or set by ``kubeletCgroupRoot``. The ``serve`` counterpart is
``test_kubelet_root_real.py``; the fixtures are ``test_nri_real.py``'s."""

from __future__ import annotations

import json
import secrets
import uuid
from pathlib import Path

import pytest
from rhp_devenv.env import ContainerdEnv

from koord_formats.topology import format_cpu_topology
from tests.integration import qos_helpers as q
from tests.integration.test_cpu_suppress_real import prepared_proc
from tests.integration.test_kubelet_root_real import BUILTINS, FULL, SLO, TOPO, qos_file
from tests.integration.test_nri_real import NriPluginProcess, containerd, nri_env  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration


def quota_set(path: str) -> bool:
    return 0 < int(qos_file(path, "cpu.cfs_quota_us")) <= FULL


@pytest.mark.parametrize("configured", [False, True], ids=["learned from the pods", "kubeletCgroupRoot set"])
def test_nri_suppresses_be_below_kubelets_cgroup_root(
    containerd: ContainerdEnv, tmp_path: Path, configured: bool  # noqa: F811  (the fixture)
) -> None:
    root = f"/rhp-root-{secrets.token_hex(4)}"
    with q.kubelet_qos_tree(root):
        node_file = tmp_path / "node.json"
        node_file.write_text(json.dumps({
            "name": "rhp-root-node",
            "nodeResourceTopology": {"annotations": {q.CPU_TOPOLOGY: format_cpu_topology(TOPO)}},
            "nodeSLO": {"resourceUsedThresholdWithBE": SLO},
        }))
        config = {
            "plugins": [{"name": name} for name in BUILTINS],
            "usageLoop": {"enable": True, "intervalSeconds": 0.5, "procRoot": str(prepared_proc(tmp_path))},
            **({"kubeletCgroupRoot": root} if configured else {}),
        }
        config_file = tmp_path / "proxy.json"
        config_file.write_text(json.dumps(config))
        be_dir = f"{root}/kubepods/besteffort"
        assert qos_file(be_dir, "cpu.cfs_quota_us") == "-1"
        plugin = NriPluginProcess(containerd.ctrd.nri_socket, tmp_path / "plugin",
                                  "--config", str(config_file), "--node-config", str(node_file)).start()
        client = containerd.cri_client()
        pods = []
        try:
            for qos, kube in (("LS", "burstable"), ("BE", "besteffort")):
                uid = str(uuid.uuid4())
                pod = client.run_pod(cgroup_parent=f"{root}/kubepods/{kube}/pod{uid}", uid=uid,
                                     labels={q.LABEL_QOS: qos})
                pods.append(pod)
                client.run_container(pod, name="c")
            q.wait_for(lambda: quota_set(be_dir), True, what=f"the BE quota below {root} set by the usage loop",
                       timeout=30.0)
        finally:
            plugin.stop()
            for pod in pods:
                client.remove_pod(pod)
