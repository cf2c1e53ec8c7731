"""kubelet in the cgroup v2 guest, joined to a control plane on the host (issue 33, item 3).

The control plane is :class:`rhp_devenv.kube.Cluster` started with ``kubelet=False`` (API
server, etcd, scheduler and controller manager on 127.0.0.1; no lock, no cgroup touched on the
host). The guest (:class:`rhp_devenv.v2node.V2Node` with one forward) reaches the API server only
through QEMU's user-mode stack with ``restrict=on`` and the single ``guestfwd``
``10.0.2.100:6443`` -> ``127.0.0.1:<apiserver port>``; the guest can reach no other address.
The API server's certificate names ``kubernetes``, so the guest's kubeconfig sets
``tls-server-name: kubernetes`` instead of naming 10.0.2.100.

:class:`GuestKubelet` puts the kube binary, a client certificate for ``system:node:v2node``, a
serving certificate and a ``KubeletConfiguration`` (``cgroupDriver: systemd``, the guest's
containerd, a loopback-only CNI network, otherwise the harness's values) into the guest, starts
kubelet as a systemd unit and waits for the Node to be Ready. Pods run with ``hostNetwork`` and
``nodeName: v2node`` and the busybox image the harness imports (``imagePullPolicy: Never``).

Under emulation this is slow (docs/v2-node.md has the times), so the test that uses it runs only
on request: ``RHP_V2_KUBELET=1 bash scripts/test.sh tests/v2/test_v2_kubelet.py``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from rhp_devenv.kube import Cluster, TlsPair, kubelet_config
from rhp_devenv.v2node import GUEST_FORWARD_ADDRESS, GUEST_SHARE, V2Node

__all__ = ["API_GUEST_PORT", "CONTAINERD_SOCKET", "NODE", "GuestKubelet"]

NODE = "v2node"
API_GUEST_PORT = 6443
_CNI = {"cniVersion": "0.4.0", "name": "rhp-loopback", "plugins": [{"type": "loopback"}]}
_HOST_LOOPBACK_CNI = Path("/usr/lib/cni/loopback")
CONTAINERD_SOCKET = Path("/run/containerd/containerd.sock")
"""The guest's containerd (kubelet's runtime endpoint unless a door of the product is in front)."""


class GuestKubelet:
    """kubelet v1.34 (the harness's kube binary) in *node*, registered with *cluster*."""

    def __init__(self, node: V2Node, cluster: Cluster) -> None:
        self.node = node
        self.cluster = cluster
        self.timings: dict[str, float] = {}
        self._installed = False

    def _files(self) -> Path:
        cluster, pki = self.cluster, self.cluster.pki
        assert pki is not None and cluster.ca is not None
        share = self.node.share / "kubelet"
        share.mkdir(exist_ok=True)
        shutil.copy(cluster.binary, share / "kube")
        shutil.copy(cluster.ca.cert, share / "ca.crt")
        shutil.copy(_HOST_LOOPBACK_CNI, share / "loopback")
        client = cluster.issue_client("v2node-kubelet", user=f"system:node:{NODE}", groups=("system:nodes",))
        serving = pki.issue(cluster.ca, "v2node-serving", cn=NODE, ips=("127.0.0.1",), server=True, client=False)
        for pair, name in ((client, "client"), (serving, "serving")):
            shutil.copy(pair.cert, share / f"{name}.crt")
            shutil.copy(pair.key, share / f"{name}.key")
        guest = Path(f"{GUEST_SHARE}/kubelet")
        kubeconfig = {
            "apiVersion": "v1", "kind": "Config", "current-context": "rhp",
            "clusters": [{"name": "rhp", "cluster": {
                "server": f"https://{GUEST_FORWARD_ADDRESS}:{API_GUEST_PORT}",
                "certificate-authority": "/etc/kubernetes/ca.crt", "tls-server-name": "kubernetes"}}],
            "users": [{"name": "kubelet", "user": {"client-certificate": "/etc/kubernetes/client.crt",
                                                   "client-key": "/etc/kubernetes/client.key"}}],
            "contexts": [{"name": "rhp", "context": {"cluster": "rhp", "user": "kubelet"}}],
        }  # fmt: skip
        (share / "kubeconfig").write_text(json.dumps(kubeconfig))
        (share / "cni.conflist").write_text(json.dumps(_CNI))
        return guest

    def _write_config(self, cri_socket: Path) -> None:
        config: dict[str, Any] = kubelet_config(
            cri_socket=cri_socket, port=10250, healthz_port=10248,
            client_ca=Path("/etc/kubernetes/ca.crt"),
            serving=TlsPair(Path("/etc/kubernetes/serving.crt"), Path("/etc/kubernetes/serving.key")),
            pod_logs_dir=Path("/var/log/pods"), cgroup_v1=False, extra={"cgroupDriver": "systemd"},
        )  # fmt: skip
        (self.node.share / "kubelet" / "config.json").write_text(json.dumps(config))

    def start(self, timeout: float = 900.0, *, cri_socket: Path = CONTAINERD_SOCKET) -> None:
        """Start kubelet in the guest with *cri_socket* as its runtime (and image) endpoint: the
        guest's containerd, or a door of the product in front of it (``runtime-proxy serve``'s
        socket). The first start copies the files in and waits for the Node to be Ready; a later
        one (after :meth:`stop`) writes only the new configuration and waits for kubelet's healthz."""
        started = time.monotonic()
        first = not self._installed
        guest = self._files() if first else Path(f"{GUEST_SHARE}/kubelet")
        self._write_config(cri_socket)
        if first:
            self.node.network_up()
            self.node.run(
                f"set -e; mkdir -p /etc/kubernetes /opt/cni/bin /etc/cni/net.d /var/lib/kubelet; "
                f"cp {guest}/kube /usr/local/bin/kube; cp {guest}/loopback /opt/cni/bin/loopback; "
                f"cp {guest}/ca.crt {guest}/client.crt {guest}/client.key {guest}/serving.crt {guest}/serving.key "
                f"{guest}/kubeconfig /etc/kubernetes/; "
                f"cp {guest}/cni.conflist /etc/cni/net.d/10-loopback.conflist",
                timeout=600, check=True,
            )
            self._installed = True
        self.node.run(
            f"set -e; cp {guest}/config.json /etc/kubernetes/config.json; "
            f"systemd-run --unit=rhp-kubelet --collect /usr/local/bin/kube kubelet "
            f"--config=/etc/kubernetes/config.json --kubeconfig=/etc/kubernetes/kubeconfig "
            f"--hostname-override={NODE} --root-dir=/var/lib/kubelet",
            timeout=600, check=True,
        )
        what = "" if first else f" again ({cri_socket})"
        self.timings[f"kubelet started{what}"] = round(time.monotonic() - started, 1)
        if first:
            self.cluster.wait_for(self._ready, what=f"node {NODE} Ready", timeout=timeout)
            self.timings["node Ready"] = round(time.monotonic() - started, 1)
        else:
            self.node.run(
                f"for i in $(seq {int(timeout)}); do busybox wget -q -O- http://127.0.0.1:10248/healthz "
                f">/dev/null 2>&1 && exit 0; sleep 1; done; exit 1",
                timeout=timeout + 60, check=True,
            )
            self.timings[f"kubelet healthy{what}"] = round(time.monotonic() - started, 1)

    def stop(self) -> None:
        """Stop the kubelet unit (its pods' containers keep running)."""
        self.node.run("systemctl stop rhp-kubelet; systemctl reset-failed rhp-kubelet 2>/dev/null; true",
                      timeout=300, check=True)

    def _ready(self) -> bool:
        node = self.cluster.get_json("node", NODE)
        if node is None:
            return False
        return any(c.get("type") == "Ready" and c.get("status") == "True"
                   for c in node.get("status", {}).get("conditions", []))

    def log(self, lines: int = 60) -> str:
        """The tail of kubelet's journal in the guest."""
        return self.node.run(f"journalctl -u rhp-kubelet --no-pager -n {lines} 2>&1", timeout=120).stdout
