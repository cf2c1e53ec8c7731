"""A real one-node Kubernetes on 127.0.0.1 for end-to-end tests, benchmarks and the demo.

:class:`Cluster` runs etcd, kube-apiserver, kube-controller-manager, kubelet and (optionally)
kube-scheduler from the multi-call binary ``scripts/build-kube.sh`` builds for each supported
Kubernetes release it covers (:data:`KUBE_VERSIONS`: v1.37.2 from ``devenv/kube/v1.37/``, the
default, and v1.34.4, the oldest supported, from ``devenv/kube/``; cached under
``/opt/runtime-hook-proxy/kube/<version>/``), with kubelet talking CRI to the socket it is given
(a private containerd, or ``runtime-proxy serve`` in front of one)::

    with PrivateContainerd("2.1") as ctrd, Cluster(ctrd.socket) as cluster:
        cluster.apply(pod_manifest)
        cluster.wait_pod_running("default", "p1")
        print(cluster.kubectl("logs", "p1").stdout)

What :meth:`Cluster.start` does, in order:

- takes a machine-wide lock (one cluster with a kubelet per machine: kubelets with the same
  cgroup root would remove each other's pod cgroups as orphans; a cluster started with
  ``kubelet=False`` takes none), then undoes what a crashed earlier run left
  (its processes by PID, its route, sysctls, iptables chains, ``/kubepods`` tree, files);
- makes a fresh work directory with a CA, serving and client certificates (``openssl``), the
  service-account key pair and one kubeconfig per client;
- adds ``blackhole 10.96.0.0/24`` (the service range: there is no kube-proxy, so nothing may
  route there) to the main routing table;
- starts etcd, kube-apiserver, kube-controller-manager, kubelet and kube-scheduler, all
  listening on 127.0.0.1 only (ports picked free at start), and waits until the node
  ``127.0.0.1`` is Ready and the ``default`` ServiceAccount exists.

kubelet runs with ``failCgroupV1: false`` (this machine's kernel mounts cgroup v1, on which
kubelet 1.35 and later refuse to start unless told so; 1.34 only warns), the cgroupfs driver and
cgroup root ``/`` (pods under ``/kubepods``; another
root with *cgroup_root*, made in every hierarchy before kubelet starts, as kubelet requires), a
private ``--root-dir`` and pod log directory, image garbage collection that never triggers
(thresholds 100/99) and hard-eviction thresholds that never trigger on a working machine.
kubelet raises a few kernel sysctls and adds iptables chains when it starts; :meth:`stop`
restores the sysctls' values and removes the chains it added.

Faults, for the end-to-end tests of what survives them: :meth:`Cluster.kill` sends a signal
(default SIGKILL) to one process by PID and keeps its record, :meth:`Cluster.respawn` starts it
again with the same command line (etcd on the same data directory), and
:meth:`Cluster.restart_component` does both for a control-plane component with a down time
between and waits for its health check. The lock, the loopback-only listeners and the
blackhole route stay throughout.

:meth:`Cluster.stop` kills every process it started (by PID), removes the route, the
``/kubepods`` tree when the cluster created it, the cgroup roots it made (with everything below
them), kubelet's ``/var/log/containers`` links and the work directory. Pods go with the
runtime: stop the private containerd after the cluster.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar

from rhp_devenv.cgroupfs import cgroup_hierarchies, relative_cgroup_path, remove_cgroup_tree
from rhp_devenv.workdir import PrivateDir

__all__ = [
    "KUBE_VERSION",
    "KUBE_VERSIONS",
    "NEWEST_KUBE_VERSION",
    "NODE_NAME",
    "OLDEST_KUBE_VERSION",
    "SERVICE_CIDR",
    "Cluster",
    "KubeError",
    "Pki",
    "TlsPair",
    "held_in_this_process",
    "kube_binary",
    "kubeconfig",
    "kubelet_config",
    "scheduler_config",
    "take_kubepods_lock",
]

T = TypeVar("T")

NEWEST_KUBE_VERSION = "v1.37.2"
"""The newest Kubernetes release the harness builds (``devenv/kube/v1.37/go.mod`` pins it)."""

OLDEST_KUBE_VERSION = "v1.34.4"
"""The oldest Kubernetes release the product supports (``devenv/kube/go.mod`` pins it)."""

KUBE_VERSIONS = (NEWEST_KUBE_VERSION, OLDEST_KUBE_VERSION)
"""Every version ``scripts/build-kube.sh`` builds (and stamps into its binary), the newest first."""

KUBE_VERSION = NEWEST_KUBE_VERSION
"""The version a :class:`Cluster` runs unless told otherwise (the end-to-end suite's)."""

DEFAULT_PREFIX = Path(os.environ.get("RHP_KUBE_PREFIX", "/opt/runtime-hook-proxy/kube"))
"""Where ``scripts/build-kube.sh`` puts the binaries (``<prefix>/<version>/kube``)."""

NODE_NAME = "127.0.0.1"
"""The node's name and InternalIP (kubelet's ``--hostname-override``)."""

SERVICE_CIDR = "10.96.0.0/24"
"""The service range; blackholed while a cluster runs (never a wider range: DNS lives in 10/8)."""

KUBEPODS = "/kubepods"
"""kubelet's pod cgroup tree with cgroup root ``/`` and the cgroupfs driver."""

_STATE_DIR = Path("/run/lock") if os.access("/run/lock", os.W_OK) else Path(tempfile.gettempdir())
_LOCK_PATH = _STATE_DIR / "rhp-kube-cluster.lock"
_STATE_PATH = _STATE_DIR / "rhp-kube-cluster.json"
_CONTAINER_LOG_LINKS = Path("/var/log/containers")
_KERNEL_TUNABLES = (  # what kubelet's container manager sets when protectKernelDefaults is false
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
_KUBELET_IPTABLES = (  # (command, table, chain) that kubelet creates (pkg/kubelet/kubelet_network_linux.go)
    ("iptables", "filter", "KUBE-FIREWALL"),
    ("iptables", "mangle", "KUBE-IPTABLES-HINT"),
    ("iptables", "mangle", "KUBE-KUBELET-CANARY"),
    ("iptables", "nat", "KUBE-KUBELET-CANARY"),
    ("iptables", "filter", "KUBE-KUBELET-CANARY"),
    ("ip6tables", "mangle", "KUBE-IPTABLES-HINT"),
    ("ip6tables", "mangle", "KUBE-KUBELET-CANARY"),
    ("ip6tables", "nat", "KUBE-KUBELET-CANARY"),
    ("ip6tables", "filter", "KUBE-KUBELET-CANARY"),
)
_CLEAN_ENV_DROP = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "KUBECONFIG")


class KubeError(RuntimeError):
    """The cluster could not be started or a call to it failed; the message has the log tail."""


def kube_binary(version: str = KUBE_VERSION, prefix: Path = DEFAULT_PREFIX) -> Path | None:
    """The multi-call binary of Kubernetes *version* (one of :data:`KUBE_VERSIONS`):
    ``$RHP_KUBE_BINARY`` (whatever the version), else ``<prefix>/<version>/kube``; None if absent."""
    if version not in KUBE_VERSIONS:
        raise ValueError(f"Kubernetes {version!r} is not built here; scripts/build-kube.sh builds {KUBE_VERSIONS}")
    override = os.environ.get("RHP_KUBE_BINARY")
    path = Path(override) if override else prefix / version / "kube"
    return path if os.access(path, os.X_OK) else None


# -- certificates -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsPair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


class Pki:
    """Certificate authorities and the certificates they sign, made with the ``openssl`` CLI.

    Keys are ECDSA P-256 (fast to make); certificates live for two days.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def _openssl(self, *args: str) -> None:
        proc = subprocess.run(
            ["openssl", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False, timeout=30
        )
        if proc.returncode != 0:
            raise KubeError(f"openssl {args[0]} failed: {proc.stderr.strip()[-500:]}")

    def ca(self, name: str) -> TlsPair:
        """A self-signed CA named *name* (files ``<name>.crt``, ``<name>.key``)."""
        pair = TlsPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        self._openssl(
            "req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", str(pair.key), "-out", str(pair.cert), "-days", "2", "-subj", f"/CN={name}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        )  # fmt: skip
        return pair

    def issue(
        self,
        ca: TlsPair,
        name: str,
        *,
        cn: str,
        orgs: Sequence[str] = (),
        ips: Sequence[str] = (),
        dns: Sequence[str] = (),
        server: bool = False,
        client: bool = True,
    ) -> TlsPair:
        """A certificate for *cn* in the groups *orgs*, signed by *ca* (files ``<name>.crt/.key``).

        *ips* and *dns* become subject alternative names; *server* and *client* choose the
        extended key usages.
        """
        pair = TlsPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        csr = self.directory / f"{name}.csr"
        ext = self.directory / f"{name}.ext"
        subject = "".join(f"/O={org}" for org in orgs) + f"/CN={cn}"
        usages = [u for u, on in (("serverAuth", server), ("clientAuth", client)) if on]
        lines = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={','.join(usages)}",
        ]
        sans = [f"IP:{ip}" for ip in ips] + [f"DNS:{name}" for name in dns]
        if sans:
            lines.append(f"subjectAltName={','.join(sans)}")
        ext.write_text("\n".join(lines) + "\n")
        self._openssl(
            "req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", str(pair.key), "-out", str(csr), "-subj", subject,
        )  # fmt: skip
        self._openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
            "-set_serial", str(int.from_bytes(secrets.token_bytes(8), "big")), "-days", "2",
            "-extfile", str(ext), "-out", str(pair.cert),
        )  # fmt: skip
        csr.unlink()
        ext.unlink()
        return pair

    def key_pair(self, name: str) -> TlsPair:
        """A bare key pair (``<name>.key`` private, ``<name>.pub`` public): service-account tokens."""
        pair = TlsPair(self.directory / f"{name}.pub", self.directory / f"{name}.key")
        self._openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", str(pair.key))
        self._openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert))
        return pair


# -- pure renderers ------------------------------------------------------------------------------------


def kubeconfig(server: str, ca: Path, client: TlsPair, user: str) -> dict[str, Any]:
    """A kubeconfig for *user* authenticating with a client certificate (files by path)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rhp", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}],
        "contexts": [{"name": "rhp", "context": {"cluster": "rhp", "user": user}}],
        "current-context": "rhp",
    }


def kubelet_config(
    *,
    cri_socket: Path,
    port: int,
    healthz_port: int,
    client_ca: Path,
    serving: TlsPair,
    pod_logs_dir: Path,
    cgroup_root: str = "/",
    cgroup_v1: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """kubelet's ``KubeletConfiguration`` for the one-node cluster (see the module docstring).

    *cgroup_root* is kubelet's ``cgroupRoot`` (``--cgroup-root``): pods go under
    ``<cgroup_root>/kubepods``; it must exist in every hierarchy kubelet uses.

    *cgroup_v1*: the node's kernel mounts cgroup v1 (this machine does), so the configuration
    sets ``failCgroupV1: false``, without which kubelet 1.35 and later exit at start (v1 is in
    maintenance upstream); False for a cgroup v2 node (the v2 guest), which keeps kubelet's
    default.

    *extra* is merged on top (shallow), e.g. ``{"featureGates": {"EventedPLEG": True}}``.
    """
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "containerRuntimeEndpoint": f"unix://{cri_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failSwapOn": False,
        "resolvConf": "",
        "podLogsDir": str(pod_logs_dir),
        # Never collect an image of the runtime, never evict because of the machine's own use.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
            "imagefs.inodesFree": "1%",
        },
        "serializeImagePulls": False,
        "registerNode": True,
    }
    if cgroup_v1:
        config["failCgroupV1"] = False
    config.update(extra or {})
    return config


def scheduler_config(
    *,
    kubeconfig_path: Path,
    base: Mapping[str, Any] | None = None,
    extenders: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """A ``KubeSchedulerConfiguration``: *base* (e.g. ``packaging/scheduler``'s file) with this
    cluster's client connection, no leader election, and *extenders* replacing base's when given."""
    config: dict[str, Any] = json.loads(json.dumps(dict(base or {})))  # a deep copy
    config.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
    config.setdefault("kind", "KubeSchedulerConfiguration")
    # base's client settings (qps, burst, contentType) stay; the kubeconfig is this cluster's
    config["clientConnection"] = {**dict(config.get("clientConnection") or {}), "kubeconfig": str(kubeconfig_path)}
    config["leaderElection"] = {"leaderElect": False}
    if extenders:
        config["extenders"] = [dict(e) for e in extenders]
    return config


# -- small helpers --------------------------------------------------------------------------------------


_HANDED_OUT: set[int] = set()
_PORT_FLOOR = 20000  # below it sit well-known and registered services' usual ports


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (``ip_local_port_range``)."""
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, taken below the kernel's
    ephemeral range so that no outgoing connection can hold it between this call and the
    listener's bind (ci4 lost a kube-apiserver start to exactly that), and never handed out
    twice by this process."""
    low, _high = _ephemeral_range()
    top = max(low - 1, _PORT_FLOOR + 1000)
    rng = secrets.SystemRandom()
    for _ in range(200):
        port = rng.randrange(_PORT_FLOOR, top)
        if port in _HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range: the kernel's pick
        sock.bind(("127.0.0.1", 0))
        fallback: int = sock.getsockname()[1]
        return fallback


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEAN_ENV_DROP}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in ticks): tells a PID's reuse apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _kill_pid(pid: int, start_time: str | None, timeout: float) -> None:
    """SIGTERM the process *pid* if it is still the one started at *start_time*; SIGKILL later."""
    if start_time is None or _proc_start_time(pid) != start_time:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _proc_start_time(pid) == start_time and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.02)
    if _proc_start_time(pid) == start_time:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _run(args: Sequence[str], *, check: bool = False, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), capture_output=True, text=True, stdin=subprocess.DEVNULL, check=check, timeout=timeout
    )


def _route(action: str) -> None:
    """``ip route replace|del blackhole SERVICE_CIDR`` (a missing route on del is fine)."""
    proc = _run(["ip", "route", action, "blackhole", SERVICE_CIDR])
    if proc.returncode != 0 and action != "del":
        raise KubeError(f"ip route {action} blackhole {SERVICE_CIDR} failed: {proc.stderr.strip()}")


def _blackhole_present() -> bool:
    """Whether the service range's blackhole route is in the main table now."""
    proc = _run(["ip", "route", "show", "type", "blackhole", SERVICE_CIDR])
    return proc.returncode == 0 and SERVICE_CIDR.split("/")[0] in proc.stdout


def _read_tunables() -> dict[str, str]:
    values: dict[str, str] = {}
    for name in _KERNEL_TUNABLES:
        with contextlib.suppress(OSError):
            values[name] = (Path("/proc/sys") / name).read_text().strip()
    return values


def _restore_tunables(saved: Mapping[str, str]) -> None:
    for name, value in saved.items():
        path = Path("/proc/sys") / name
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value + "\n")


def _iptables_chains() -> list[list[str]]:
    """The chains of :data:`_KUBELET_IPTABLES` that exist now."""
    found: list[list[str]] = []
    for tool, table, chain in _KUBELET_IPTABLES:
        if shutil.which(tool) and _run([tool, "-w", "5", "-t", table, "-S", chain]).returncode == 0:
            found.append([tool, table, chain])
    return found


def _remove_iptables_chains(keep: Iterable[Sequence[str]]) -> None:
    """Delete kubelet's chains (and the jumps to them) that were not there before (*keep*)."""
    kept = {tuple(entry) for entry in keep}
    for tool, table, chain in _KUBELET_IPTABLES:
        if (tool, table, chain) in kept or not shutil.which(tool):
            continue
        if _run([tool, "-w", "5", "-t", table, "-S", chain]).returncode != 0:
            continue
        for builtin in ("INPUT", "OUTPUT"):
            for _ in range(10):  # each -D removes one copy of the jump
                if _run([tool, "-w", "5", "-t", table, "-D", builtin, "-j", chain]).returncode != 0:
                    break
        _run([tool, "-w", "5", "-t", table, "-F", chain])
        _run([tool, "-w", "5", "-t", table, "-X", chain])


def _mounts_under(directory: Path) -> list[str]:
    prefix = str(directory).rstrip("/") + "/"
    points: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as info:
        for line in info:
            fields = line.split()
            if len(fields) > 4:
                point = fields[4].encode().decode("unicode_escape")
                if point.startswith(prefix):
                    points.append(point)
    return sorted(set(points), key=lambda p: (p.count("/"), p), reverse=True)


def _unmount_under(directory: Path) -> None:
    for point in _mounts_under(directory):
        _run(["umount", "-l", point])


def _remove_log_links(work_dir: Path) -> None:
    """kubelet's ``/var/log/containers/*.log`` links that point into *work_dir*."""
    with contextlib.suppress(OSError):
        for link in _CONTAINER_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(work_dir) + "/"):
                    link.unlink()


def _kubepods_exists() -> bool:
    return any((h / KUBEPODS.lstrip("/")).exists() for h in cgroup_hierarchies())


def _cgroup_root_exists(root: str) -> bool:
    rel = relative_cgroup_path(root)
    return any((h / rel).exists() for h in cgroup_hierarchies())


def _make_cgroup_root(root: str) -> None:
    """Create kubelet's cgroup root *root* (and its parents) in every hierarchy: kubelet refuses
    to start when it is missing in one of those it uses. New cpuset dirs (v1) get their parent's
    CPUs and memory nodes, or no task could join them."""
    rel = relative_cgroup_path(root)
    for hierarchy in cgroup_hierarchies():
        directory = hierarchy
        for part in rel.parts:
            directory = directory / part
            directory.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for file in ("cpuset.cpus", "cpuset.mems"):
                    with contextlib.suppress(FileNotFoundError):
                        if not (directory / file).read_text().strip():
                            (directory / file).write_text((directory.parent / file).read_text())


def _undo(state: Mapping[str, Any]) -> None:
    """Undo what the cluster described by *state* changed on the machine (stop or crash recovery).

    A state without ``work_dir`` (a run that died before it changed anything but the route)
    only loses the route.
    """
    for pid, start_time in state.get("pids", []):
        _kill_pid(int(pid), start_time, timeout=10.0)
    _route("del")
    work = state.get("work_dir")
    if not work:
        return
    _restore_tunables(state.get("tunables", {}))
    _remove_iptables_chains(state.get("iptables", []))
    if state.get("kubepods_created"):
        remove_cgroup_tree(KUBEPODS, kill=True, timeout=10.0)
    for root in state.get("cgroup_roots", []):  # made by the run: only its kubelet's pods live there
        with contextlib.suppress(ValueError):
            remove_cgroup_tree(str(root), kill=True, timeout=10.0)
    work_dir = Path(work)
    _unmount_under(work_dir)
    _remove_log_links(work_dir)
    if state.get("log_links_dir_created"):
        with contextlib.suppress(OSError):
            _CONTAINER_LOG_LINKS.rmdir()  # only when empty: someone else's links stay
    if not state.get("keep_work_dir"):
        shutil.rmtree(work_dir, ignore_errors=True)


_HELD: list[IO[str]] = []
"""The lock files this process took (closed ones are dropped when next looked at)."""


def held_in_this_process() -> bool:
    """Whether this process holds the machine-wide cluster lock (a running :class:`Cluster`, or a
    caller of :func:`take_kubepods_lock` that has not closed it yet)."""
    _HELD[:] = [lock for lock in _HELD if not lock.closed]
    return bool(_HELD)


def take_kubepods_lock(timeout: float) -> IO[str] | None:
    """Take the machine-wide lock on kubelet's ``/kubepods`` cgroup tree, waiting up to *timeout*
    seconds (0: try once); None when someone else still holds it.

    A :class:`Cluster` holds it while it runs. Anything else that creates pods under
    ``/kubepods`` must hold it too: a running kubelet kills pod cgroups it does not know there.
    Closing the returned file releases the lock (so does the process's death).
    """
    if held_in_this_process():
        # flock between two open files of one process conflicts too: waiting would wait for
        # ourselves until the timeout.
        return None
    lock = open(_LOCK_PATH, "a+")  # noqa: SIM115 - the caller closes it
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _HELD.append(lock)
            return lock
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                lock.close()
                raise
        if time.monotonic() >= deadline:
            lock.close()
            return None
        time.sleep(0.5)


# -- the cluster -------------------------------------------------------------------------------------


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    start_time: str | None
    argv: list[str]
    """The command as :meth:`Cluster.spawn` was given it (what :meth:`Cluster.respawn` runs again)."""
    env: dict[str, str]


class Cluster(PrivateDir):
    """A one-node Kubernetes on 127.0.0.1 whose kubelet uses the CRI socket *cri_socket*.

    Start and stop it with :meth:`start` and :meth:`stop`, or use it as a context manager.
    Not thread-safe. See the module docstring for what it changes on the machine and undoes.
    """

    # long: the docstring documents each of its sixteen settings; the body only stores them
    def __init__(
        self,
        cri_socket: str | Path,
        *,
        binary: Path | None = None,
        version: str = KUBE_VERSION,
        work_dir: Path | None = None,
        scheduler: bool = True,
        scheduler_base: Mapping[str, Any] | None = None,
        extenders: Sequence[Mapping[str, Any]] = (),
        kubelet_extra: Mapping[str, Any] | None = None,
        cgroup_root: str = "/",
        kubelet: bool = True,
        apiserver_args: Sequence[str] = (),
        controller_manager_args: Sequence[str] = (),
        start_timeout: float = 180.0,
        lock_timeout: float = 1800.0,
        keep_work_dir: bool = False,
    ) -> None:
        """Prepare (but do not start) a cluster.

        :param cri_socket: the CRI unix socket kubelet uses (containerd's or a proxy's).
        :param binary: the multi-call binary; default ``kube_binary(version)``.
        :param version: the Kubernetes release to run (one of :data:`KUBE_VERSIONS`; default
            the newest); kubelet's configuration is the same for every one of them.
        :param work_dir: where certificates, configs, data and logs go; default a fresh
            ``/tmp/rhp-kube-*``; removed by :meth:`stop` unless *keep_work_dir*.
        :param scheduler: start kube-scheduler in :meth:`start` (else call :meth:`start_scheduler`).
        :param scheduler_base: the ``KubeSchedulerConfiguration`` to start from.
        :param extenders: extenders for kube-scheduler (replace *scheduler_base*'s).
        :param kubelet_extra: merged into kubelet's configuration (see :func:`kubelet_config`).
        :param cgroup_root: kubelet's ``cgroupRoot`` (e.g. ``/rhp-e2e-root``); made in every
            hierarchy when missing, and then removed with everything below it by :meth:`stop`
            (and by the next start after a crash). Change :attr:`cgroup_root` and call
            :meth:`restart_kubelet` with ``rewrite_config=True`` to move a live kubelet.
        :param kubelet: start kubelet (and wait for the node ``127.0.0.1`` to be Ready); without
            it the cluster has only the Node objects its user creates (API-only nodes, as for
            kube-scheduler throughput), *cri_socket* is never used, and the cluster neither
            takes the machine's lock nor writes its crash-recovery state (it touches no cgroup,
            sysctl or iptables chain; its processes die with the one that started them), so it
            can run beside a cluster with a kubelet. It adds the service-range route only when
            none is there, and removes it on stop only if it added it and no locked cluster runs.
        :param apiserver_args: extra kube-apiserver flags, after the harness's (e.g.
            ``--disable-admission-plugins=TaintNodesByCondition``).
        :param controller_manager_args: extra kube-controller-manager flags, after the
            harness's (a list flag given again adds to it: ``--controllers=-nodelifecycle``).
        :param start_timeout: seconds for everything to come up.
        :param lock_timeout: seconds to wait for another cluster on this machine to stop.
        """
        found = binary or kube_binary(version)
        if found is None:
            raise KubeError(f"the kube binary of Kubernetes {version} is missing: run scripts/build-kube.sh "
                            "(scripts/install-deps.sh does)")
        self.binary = found
        self.version = version
        self.cri_socket = Path(cri_socket)
        self.start_scheduler_at_start = scheduler
        self.scheduler_base = dict(scheduler_base or {})
        self.extenders = [dict(e) for e in extenders]
        self.kubelet_extra = dict(kubelet_extra or {})
        if cgroup_root.strip("/"):
            relative_cgroup_path(cgroup_root)  # ValueError on '..', '.' or a systemd slice
        self.cgroup_root = cgroup_root
        self.run_kubelet = kubelet
        self.apiserver_args = list(apiserver_args)
        self.controller_manager_args = list(controller_manager_args)
        self.start_timeout = start_timeout
        self.lock_timeout = lock_timeout
        self.keep_work_dir = keep_work_dir
        self._requested_work_dir = work_dir
        self._work_dir: Path | None = None
        self._lock: IO[str] | None = None
        self._started = False
        self._route_added = False
        self._procs: dict[str, _Proc] = {}
        self._state: dict[str, Any] = {}
        self.ports: dict[str, int] = {}
        self.pki: Pki | None = None
        self.ca: TlsPair | None = None
        self._kubeconfigs: dict[str, Path] = {}
        self.start_seconds = 0.0
        """Wall time of the last :meth:`start`: certificates to node Ready."""

    # -- paths and identities --------------------------------------------------------------------------

    @property
    def server(self) -> str:
        """The API server's URL."""
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def admin_kubeconfig(self) -> Path:
        """The kubeconfig of a ``system:masters`` user."""
        return self._kubeconfigs["admin"]

    def log_path(self, component: str) -> Path:
        """The combined stdout and stderr of *component* (``kubelet``, ``etcd``, ...)."""
        return self.work_dir / "logs" / f"{component}.log"

    def log_tail(self, component: str, lines: int = 30) -> str:
        """The last *lines* of *component*'s log."""
        try:
            return "\n".join(self.log_path(component).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def pid(self, component: str) -> int | None:
        """The PID of a started component while it runs."""
        proc = self._procs.get(component)
        return proc.popen.pid if proc is not None and proc.popen.poll() is None else None

    def issue_client(self, name: str, *, user: str, groups: Sequence[str] = ()) -> TlsPair:
        """A client certificate of the cluster CA for *user* in *groups* (file ``<name>``)."""
        assert self.pki is not None and self.ca is not None
        return self.pki.issue(self.ca, name, cn=user, orgs=groups)

    def kubeconfig_for(self, name: str, *, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig file for *user* (in *groups*) with a fresh client certificate.

        For example ``kubeconfig_for("ext", user="system:serviceaccount:kube-system:scheduler-ext")``
        gives a program the identity of that ServiceAccount, so RBAC bound to it applies.
        """
        if name in self._kubeconfigs:
            return self._kubeconfigs[name]
        assert self.ca is not None
        pair = self.issue_client(name, user=user, groups=groups)
        path = self.work_dir / "kubeconfigs" / f"{name}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(kubeconfig(self.server, self.ca.cert, pair, user), indent=1))
        self._kubeconfigs[name] = path
        return path

    # -- lifecycle -------------------------------------------------------------------------------------

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> Cluster:
        """Take the machine's cluster lock, clean up after a crashed run, start every component
        and wait until the node is Ready (see the module docstring). A component that lost its
        port to another listener between the pick and its bind makes a fresh start on new ports
        (at most three starts).

        :raises KubeError: a component exited or did not become ready in time; everything
            started is stopped first and the message has its log tail.
        """
        for attempt in range(3):
            try:
                return self._start_once()
            except KubeError as exc:
                if "address already in use" not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self) -> Cluster:
        if self._started:
            raise RuntimeError("Cluster is already started")
        self._started = True
        if self.run_kubelet:
            self._take_lock()
        began = time.monotonic()
        try:
            if self.run_kubelet:
                self._recover_crashed_run()
            self._prepare()
            deadline = began + self.start_timeout
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            self._start_controller_manager()
            if self.run_kubelet:
                self.write_kubelet_config()
                self._start_kubelet()
            if self.start_scheduler_at_start:
                self.start_scheduler(deadline=deadline)
            if self.run_kubelet:
                self._wait_node_ready(deadline)
            self.wait_for(
                lambda: self.kubectl("get", "serviceaccount", "default", "-o", "name", check=False).returncode == 0,
                what="the default ServiceAccount (kube-controller-manager)",
                timeout=max(1.0, deadline - time.monotonic()),
            )
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Kill every process started (by PID), remove the route and what kubelet added, and the
        work directory. Safe to call more than once and after a failed :meth:`start`; also
        releases a lock taken by ``_take_lock`` without a start."""
        if not self._started and self._lock is None:
            return
        self._record_pids()
        for proc in reversed(list(self._procs.values())):  # kubelet before the API server
            _kill_pid(proc.popen.pid, proc.start_time, timeout=10.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=5)
        self._procs.clear()
        if self.run_kubelet:
            _undo(self._state)
            with contextlib.suppress(OSError):
                _STATE_PATH.unlink()
        else:
            self._stop_unlocked()
        self._state = {}
        self._work_dir = None
        self._started = False
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.close()

    def _stop_unlocked(self) -> None:
        """A kubelet-less cluster's clean-up: its work directory, and the route if it added it
        and no cluster holding the machine's lock (which owns the route then) runs."""
        if self._route_added:
            free = take_kubepods_lock(0)
            if free is not None:
                _route("del")
                free.close()
            self._route_added = False
        if self._work_dir is not None and not self.keep_work_dir:
            shutil.rmtree(self._work_dir, ignore_errors=True)

    def _take_lock(self) -> None:
        if held_in_this_process():
            raise KubeError(f"this process already holds {_LOCK_PATH} (a cluster it started still runs): "
                            "stop that cluster first; waiting would wait for itself")
        self._lock = take_kubepods_lock(self.lock_timeout)
        if self._lock is None:
            raise KubeError(f"another cluster held {_LOCK_PATH} for more than {self.lock_timeout:.0f} s")

    def _recover_crashed_run(self) -> None:
        """Undo what a run that died without :meth:`stop` left (we hold the lock: it is gone)."""
        try:
            state = json.loads(_STATE_PATH.read_text())
        except (OSError, ValueError):
            state = None
        if isinstance(state, dict):
            _undo(state)
        else:
            _route("del")  # a route left by a run that died before writing its state
        with contextlib.suppress(OSError):
            _STATE_PATH.unlink()

    def _save_state(self) -> None:
        if not self.run_kubelet:  # a kubelet-less cluster leaves the machine's state file alone
            return
        tmp = _STATE_PATH.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state))
        tmp.replace(_STATE_PATH)

    def _record_pids(self) -> None:
        if "work_dir" in self._state:  # only a prepared run has anything to record
            self._state["pids"] = [[p.popen.pid, p.start_time] for p in self._procs.values()]
            self._save_state()

    def _prepare(self) -> None:
        self._make_work_dir("rhp-kube-")
        self._state = {
            "owner": os.getpid(),
            "work_dir": str(self._work_dir),
            "keep_work_dir": self.keep_work_dir,
            "pids": [],
            "tunables": _read_tunables(),
            "iptables": _iptables_chains(),
            "kubepods_created": not _kubepods_exists(),
            "log_links_dir_created": not _CONTAINER_LOG_LINKS.exists(),
        }
        self._save_state()
        for sub in ("logs", "etcd", "kubelet", "pod-logs", "kubeconfigs"):
            (self.work_dir / sub).mkdir(parents=True, exist_ok=True)
        for name in ("apiserver", "etcd", "etcd_peer", "etcd_metrics", "kubelet", "kubelet_healthz",
                     "scheduler", "controller_manager"):  # fmt: skip
            self.ports[name] = free_port()
        if self.run_kubelet:
            _route("replace")
        elif not _blackhole_present():
            _route("replace")
            self._route_added = True
        self._make_pki()

    def _make_pki(self) -> None:
        pki = self.pki = Pki(self.work_dir / "pki")
        ca = self.ca = pki.ca("ca")
        self.apiserver_cert = pki.issue(
            ca, "apiserver", cn="kube-apiserver", server=True, client=False,
            ips=("127.0.0.1", "10.96.0.1"),
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"),
        )  # fmt: skip
        self.apiserver_kubelet_client = pki.issue(ca, "apiserver-kubelet-client", cn="kube-apiserver-kubelet-client",
                                                  orgs=("system:masters",))  # fmt: skip
        self.kubelet_serving = pki.issue(ca, "kubelet-serving", cn=NODE_NAME, ips=("127.0.0.1",), server=True,
                                         client=False)  # fmt: skip
        self.service_accounts = pki.key_pair("service-accounts")
        self.kubeconfig_for("admin", user="admin", groups=("system:masters",))
        self.kubeconfig_for("kubelet", user=f"system:node:{NODE_NAME}", groups=("system:nodes",))
        self.kubeconfig_for("kube-scheduler", user="system:kube-scheduler")
        self.kubeconfig_for("kube-controller-manager", user="system:kube-controller-manager")

    # -- processes ---------------------------------------------------------------------------------------

    def spawn(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start *argv* as a process of this cluster, logged to :meth:`log_path` of *name*, killed
        by :meth:`stop` (and with the process that started it). For example the extender."""
        if name in self._procs and self._procs[name].popen.poll() is None:
            raise RuntimeError(f"{name} is already running")
        cmd = list(argv)
        if shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
        log = self.log_path(name)
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**_clean_env(), **(env or {})},
                cwd=self.work_dir,
                start_new_session=True,
            )
        self._procs[name] = _Proc(name, popen, log, _proc_start_time(popen.pid), list(argv), dict(env or {}))
        self._record_pids()
        return popen

    def kill(self, name: str, *, sig: int = signal.SIGKILL, timeout: float = 15.0) -> None:
        """Send *sig* (default SIGKILL) to the process *name* by PID and wait until it exited. Its
        record stays, so :meth:`respawn` can start it again as it was (a fault, not a stop: the
        route, the lock and the work directory are untouched)."""
        proc = self._procs.get(name)
        if proc is None:
            raise KeyError(f"no process {name} was started")
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.popen.pid, sig)
            try:
                proc.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=timeout)

    def command(self, name: str) -> list[str]:
        """The command the process *name* was last started with (as given to :meth:`spawn`)."""
        proc = self._procs.get(name)
        if proc is None:
            raise KeyError(f"no process {name} was started")
        return list(proc.argv)

    def respawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start the process *name* again (after :meth:`kill`, or after it exited) with the command
        and environment it was last started with, on the same log; etcd keeps its data
        directory, the components their ports and certificates."""
        proc = self._procs.get(name)
        if proc is None:
            raise KeyError(f"no process {name} was started")
        if proc.popen.poll() is None:
            raise RuntimeError(f"{name} is still running")
        return self.spawn(name, proc.argv, env=proc.env or None)

    def health_url(self, component: str) -> tuple[str, ssl.SSLContext | None]:
        """Where :meth:`restart_component` sees *component* ready again, and the TLS to ask with."""
        if component == "etcd":
            return f"http://127.0.0.1:{self.ports['etcd']}/health", None
        if component == "kube-apiserver":
            return f"{self.server}/readyz", self.admin_tls()
        if component in ("kube-scheduler", "kube-controller-manager"):
            insecure = ssl.create_default_context()
            insecure.check_hostname = False
            insecure.verify_mode = ssl.CERT_NONE  # self-signed serving certificates made at start
            port = self.ports["scheduler" if component == "kube-scheduler" else "controller_manager"]
            return f"https://127.0.0.1:{port}/healthz", insecure
        if component == "kubelet":
            return f"http://127.0.0.1:{self.ports['kubelet_healthz']}/healthz", None
        raise ValueError(f"no health check for {component}")

    def healthy(self, component: str) -> bool:
        """Whether *component*'s health check (:meth:`health_url`) answers 200 now."""
        url, tls = self.health_url(component)
        try:
            return _http_get(url, tls)[0] == 200
        except OSError:
            return False

    def restart_component(
        self, component: str, *, down: float = 0.0, sig: int = signal.SIGKILL, timeout: float = 180.0
    ) -> float:
        """A control-plane fault: send *sig* (default SIGKILL) to *component* (``etcd``,
        ``kube-apiserver``, ``kube-scheduler``, ``kube-controller-manager`` or ``kubelet``), keep
        it down *down* seconds, start it again with its own command line (etcd on the same data
        directory) and wait until its health check answers 200. Returns the seconds from the
        restart to healthy. The cluster's lock, its loopback-only listeners and the service
        range's blackhole route stay as they are."""
        url, tls = self.health_url(component)
        self.kill(component, sig=sig)
        if down > 0:
            time.sleep(down)
        began = time.monotonic()
        self.respawn(component)
        self._wait_http(component, url, began + timeout, tls=tls)
        return time.monotonic() - began

    def stop_process(self, name: str, *, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        """Stop one process started by :meth:`spawn` (or a component), by PID."""
        proc = self._procs.pop(name, None)
        if proc is None:
            return
        if proc.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.popen.pid, sig)
            try:
                proc.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=timeout)
        self._record_pids()

    def _component(self, name: str, args: Sequence[str]) -> None:
        self.spawn(name, [str(self.binary), name, *args])

    def check_alive(self, name: str) -> None:
        """Raise :class:`KubeError` with its log tail when the process *name* started and exited."""
        proc = self._procs.get(name)
        if proc is not None and proc.popen.poll() is not None:
            raise KubeError(f"{name} exited with code {proc.popen.returncode}; log {proc.log}:\n{self.log_tail(name)}")

    def _wait_http(self, name: str, url: str, deadline: float, *, tls: ssl.SSLContext | None = None) -> None:
        last = "no answer"
        while True:
            self.check_alive(name)
            try:
                status, body = _http_get(url, tls)
                if status == 200:
                    return
                last = f"HTTP {status}: {body[:200]!r}"
            except OSError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise KubeError(f"{name} was not ready at {url} in time ({last}); log:\n{self.log_tail(name)}")
            time.sleep(0.1)

    def admin_tls(self) -> ssl.SSLContext:
        """An SSL context that trusts the cluster CA and presents the admin certificate."""
        assert self.ca is not None and self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.ca.cert))
        admin = TlsPair(self.pki.directory / "admin.crt", self.pki.directory / "admin.key")
        ctx.load_cert_chain(str(admin.cert), str(admin.key))
        return ctx

    def _start_etcd(self, deadline: float) -> None:
        p = self.ports
        client, peer = f"http://127.0.0.1:{p['etcd']}", f"http://127.0.0.1:{p['etcd_peer']}"
        self._component("etcd", [
            "--name=rhp", f"--data-dir={self.work_dir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=rhp={peer}", f"--listen-metrics-urls=http://127.0.0.1:{p['etcd_metrics']}",
            "--unsafe-no-fsync", "--log-level=warn",
        ])  # fmt: skip
        self._wait_http("etcd", f"{client}/health", deadline)

    def _start_apiserver(self, deadline: float) -> None:
        assert self.ca is not None
        sa = self.service_accounts
        self._component("kube-apiserver", [
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.ports['apiserver']}",
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
            "--endpoint-reconciler-type=none", "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--client-ca-file={self.ca.cert}",
            f"--tls-cert-file={self.apiserver_cert.cert}", f"--tls-private-key-file={self.apiserver_cert.key}",
            f"--kubelet-client-certificate={self.apiserver_kubelet_client.cert}",
            f"--kubelet-client-key={self.apiserver_kubelet_client.key}",
            f"--kubelet-certificate-authority={self.ca.cert}",
            f"--service-account-key-file={sa.cert}", f"--service-account-signing-key-file={sa.key}",
            f"--service-account-issuer=https://127.0.0.1:{self.ports['apiserver']}",
            f"--cert-dir={self.work_dir / 'pki' / 'apiserver-generated'}",
            "--allow-privileged=true", "--profiling=false", *self.apiserver_args,
        ])  # fmt: skip
        self._wait_http("kube-apiserver", f"{self.server}/readyz", deadline, tls=self.admin_tls())

    def _start_controller_manager(self) -> None:
        assert self.ca is not None
        kubeconfig_path = self._kubeconfigs["kube-controller-manager"]
        self._component("kube-controller-manager", [
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['controller_manager']}",
            f"--kubeconfig={kubeconfig_path}",
            # No node IPAM (no pod CIDRs here). cloud-node-lifecycle did nothing without a cloud
            # provider and is gone in 1.37, whose controller manager exits on its name.
            "--controllers=*,-nodeipam",
            f"--root-ca-file={self.ca.cert}", f"--service-account-private-key-file={self.service_accounts.key}",
            "--use-service-account-credentials", "--leader-elect=false",
            f"--cluster-signing-cert-file={self.ca.cert}", f"--cluster-signing-key-file={self.ca.key}",
            *self.controller_manager_args,
        ])  # fmt: skip

    @property
    def kubelet_config_path(self) -> Path:
        """kubelet's ``KubeletConfiguration`` file (JSON), as :meth:`start` wrote it."""
        return self.work_dir / "kubelet-config.json"

    def write_kubelet_config(self) -> None:
        """(Re)write :attr:`kubelet_config_path` from :attr:`cri_socket` and the settings; make
        :attr:`cgroup_root` when it is missing (recorded for :meth:`stop` and crash recovery)."""
        assert self.ca is not None
        root = self.cgroup_root
        if root.strip("/") and not _cgroup_root_exists(root):
            roots = self._state.setdefault("cgroup_roots", [])
            if root not in roots:
                roots.append(root)
                self._save_state()  # recorded before it exists: a crash in between leaves nothing
            _make_cgroup_root(root)
        config = kubelet_config(
            cri_socket=self.cri_socket,
            port=self.ports["kubelet"],
            healthz_port=self.ports["kubelet_healthz"],
            client_ca=self.ca.cert,
            serving=self.kubelet_serving,
            pod_logs_dir=self.work_dir / "pod-logs",
            cgroup_root=root,
            extra=self.kubelet_extra,
        )
        self.kubelet_config_path.write_text(json.dumps(config, indent=1))

    def _start_kubelet(self) -> None:
        self._component("kubelet", [
            f"--config={self.kubelet_config_path}", f"--kubeconfig={self._kubeconfigs['kubelet']}",
            f"--root-dir={self.work_dir / 'kubelet'}", f"--hostname-override={NODE_NAME}",
        ])  # fmt: skip

    def restart_kubelet(self, *, rewrite_config: bool = False, timeout: float = 60.0) -> None:
        """Stop kubelet (SIGTERM, by PID) and start it again, as ``systemctl restart kubelet``
        would: on its config file as it is now (edited by ``runtime-proxy kubelet-switch``, say),
        or, with *rewrite_config*, rewritten first (after a change of :attr:`cri_socket`). Waits
        until the node is Ready."""
        self.stop_process("kubelet")
        if rewrite_config:
            self.write_kubelet_config()
        self._start_kubelet()
        self._wait_node_ready(time.monotonic() + timeout)

    def start_scheduler(
        self,
        *,
        extenders: Sequence[Mapping[str, Any]] | None = None,
        base: Mapping[str, Any] | None = None,
        deadline: float | None = None,
    ) -> None:
        """(Re)start kube-scheduler with *extenders* and *base* (default: the constructor's)."""
        if extenders is not None:
            self.extenders = [dict(e) for e in extenders]
        if base is not None:
            self.scheduler_base = dict(base)
        self.stop_process("kube-scheduler")
        config = scheduler_config(
            kubeconfig_path=self._kubeconfigs["kube-scheduler"], base=self.scheduler_base, extenders=self.extenders
        )
        config_path = self.work_dir / "kube-scheduler-config.json"
        config_path.write_text(json.dumps(config, indent=1))
        self._component("kube-scheduler", [
            f"--config={config_path}", "--bind-address=127.0.0.1", f"--secure-port={self.ports['scheduler']}",
        ])  # fmt: skip
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its serving certificate is self-signed at start
        when = deadline if deadline is not None else time.monotonic() + self.start_timeout
        self._wait_http("kube-scheduler", f"https://127.0.0.1:{self.ports['scheduler']}/healthz", when, tls=insecure)

    def _wait_node_ready(self, deadline: float) -> None:
        def ready() -> bool:
            self.check_alive("kubelet")
            node = self.get_json("node", NODE_NAME)
            if node is None:
                return False
            conditions = node.get("status", {}).get("conditions", [])
            return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

        self.wait_for(ready, what=f"node {NODE_NAME} Ready", timeout=max(1.0, deadline - time.monotonic()),
                      log="kubelet")  # fmt: skip

    # -- the API -----------------------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl --kubeconfig ADMIN ARGS...`` (our binary) and return its output.

        :raises KubeError: with *check*, on a non-zero exit (the message has stderr).
        """
        cmd = self.kubectl_command(*args, kubeconfig=kubeconfig)
        proc = subprocess.run(
            cmd, input=input, capture_output=True, text=True, timeout=timeout, env=_clean_env(), check=False,
            stdin=None if input is not None else subprocess.DEVNULL,
        )  # fmt: skip
        if check and proc.returncode != 0:
            raise KubeError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return proc

    def kubectl_command(self, *args: str, kubeconfig: Path | None = None) -> list[str]:
        """The command line of ``kubectl ARGS...`` as :meth:`kubectl` runs it (for a long-running
        one such as ``port-forward``: run it with :meth:`kubectl_env`)."""
        return [
            str(self.binary), "kubectl", f"--kubeconfig={kubeconfig or self.admin_kubeconfig}",
            f"--cache-dir={self.work_dir / 'kubectl-cache'}", *args,
        ]  # fmt: skip

    @staticmethod
    def kubectl_env() -> dict[str, str]:
        """The environment :meth:`kubectl` runs in (no proxy variables, no ``KUBECONFIG``)."""
        return _clean_env()

    def apply(self, *objects: Mapping[str, Any] | str, server_side: bool = False) -> None:
        """``kubectl apply -f -`` each object (a dict, or YAML/JSON text)."""
        for obj in objects:
            text = obj if isinstance(obj, str) else json.dumps(obj)
            extra = ("--server-side", "--force-conflicts") if server_side else ()
            self.kubectl("apply", *extra, "-f", "-", input=text)

    def get_json(self, kind: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """The object as JSON, or None when it does not exist."""
        ns = ("-n", namespace) if namespace else ()
        proc = self.kubectl("get", kind, name, *ns, "-o", "json", check=False)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise KubeError(f"kubectl get {kind} {name} failed: {proc.stderr.strip()[-2000:]}")
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    def wait_for(
        self, check: Callable[[], T | None], *, what: str, timeout: float = 60.0, log: str | None = None
    ) -> T:
        """Poll *check* until it returns something truthy and return that; fail at *timeout*."""
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                tail = f"; {log} log:\n{self.log_tail(log)}" if log else ""
                raise KubeError(f"timed out after {timeout:.0f} s waiting for {what}{tail}")
            time.sleep(0.2)

    def wait_pod_running(self, namespace: str, name: str, *, timeout: float = 90.0) -> dict[str, Any]:
        """Wait until the pod is Running with every container ready; return it."""

        def running() -> dict[str, Any] | None:
            pod = self.get_json("pod", name, namespace=namespace)
            if pod is None:
                return None
            status = pod.get("status", {})
            statuses = status.get("containerStatuses", [])
            if status.get("phase") == "Running" and statuses and all(s.get("ready") for s in statuses):
                return pod
            return None

        try:
            return self.wait_for(running, what=f"pod {namespace}/{name} Running", timeout=timeout)
        except KubeError as exc:
            pod = self.get_json("pod", name, namespace=namespace)
            events = self.kubectl("get", "events", "-n", namespace, "--field-selector",
                                  f"involvedObject.name={name}", check=False).stdout  # fmt: skip
            raise KubeError(f"{exc}\nstatus: {json.dumps((pod or {}).get('status'))[:2000]}\nevents:\n{events}"
                            f"\nkubelet log:\n{self.log_tail('kubelet')}") from None  # fmt: skip


def _http_get(url: str, tls: ssl.SSLContext | None, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET *url* on 127.0.0.1 (``http://`` or ``https://`` with *tls*); no proxy is ever used."""
    scheme, rest = url.split("://", 1)
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    conn: http.client.HTTPConnection
    if scheme == "https":
        conn = http.client.HTTPSConnection(host, int(port or 443), timeout=timeout, context=tls)
    else:
        conn = http.client.HTTPConnection(host, int(port or 80), timeout=timeout)
    try:
        conn.request("GET", "/" + path)
        response = conn.getresponse()
        return response.status, response.read(4096)
    finally:
        conn.close()
