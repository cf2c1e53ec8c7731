"""One private containerd plus the bookkeeping tests, the demo and benchmarks need around it.

:class:`ContainerdEnv` is what the integration fixtures yield (``tests/integration/conftest.py``)
and what a benchmark or demo script can use directly::

    with ContainerdEnv.start("2.1") as env:
        cri = env.cri_client()
        pod = cri.run_pod(cgroup_parent=env.new_cgroup_parent())

It owns a private top cgroup directory (``/rhptest-<random>-<v>``), so several users on one
machine never touch each other's pod cgroups, and it cleans up per "round" (a test):
:meth:`begin_round` remembers the pods that exist, :meth:`end_round` removes the newer ones, the
round's cgroup parents and clients.
"""

from __future__ import annotations

import contextlib
import secrets
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from rhp_devenv.cgroupfs import pod_cgroup_parent, remove_cgroup_tree
from rhp_devenv.containerd import PrivateContainerd, reap_stale_work_dirs
from rhp_devenv.cri import CriClient

__all__ = ["ContainerdEnv"]


@dataclass
class ContainerdEnv:
    """One running private containerd and the helpers around it."""

    ctrd: PrivateContainerd
    """The daemon (``ctrd.ctr(...)``, ``ctrd.log_path``, ``ctrd.work_dir``, ...)."""
    cgroup_top: str
    """The private top cgroup directory, ``/rhptest-<random>-<v>``; removed on :meth:`stop`."""
    setup_seconds: float = 0.0
    """How long :meth:`start` took: daemon start, CRI ready, image import."""
    _round_parents: list[str] = field(default_factory=list)
    _round_clients: list[CriClient] = field(default_factory=list)
    _round_pods: set[str] = field(default_factory=set)

    @classmethod
    def start(cls, version: str, *, tag: str | None = None, reap_stale: bool = True) -> ContainerdEnv:
        """Start a :class:`PrivateContainerd` of *version* with the image imported.

        :param tag: names the top cgroup directory ``/rhptest-<tag>-<v>``; default random.
        :param reap_stale: first clean up after private containerds whose owner died
            (:func:`~rhp_devenv.containerd.reap_stale_work_dirs`).
        :raises ContainerdError: see :meth:`PrivateContainerd.start`.
        """
        began = time.monotonic()
        if reap_stale:
            reap_stale_work_dirs()
        ctrd = PrivateContainerd(version).start()
        top = f"/rhptest-{tag or secrets.token_hex(4)}-{version.replace('.', '')}"
        ctrd.track_cgroup_parent(top)
        return cls(ctrd=ctrd, cgroup_top=top, setup_seconds=time.monotonic() - began)

    def stop(self) -> None:
        """Close clients and stop the containerd (pods, daemon, cgroups, files)."""
        for client in self._round_clients:
            client.close()
        self._round_clients.clear()
        self.ctrd.stop()

    def __enter__(self) -> ContainerdEnv:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def socket(self) -> Path:
        """containerd's CRI (and containerd API) socket."""
        return self.ctrd.socket

    @property
    def version(self) -> str:
        """``"1.6"``, ``"1.7"`` or ``"2.1"``."""
        return self.ctrd.version

    def cri_client(
        self, socket: str | Path | None = None, *, timeout: float = 30.0, wait_for_ready: bool = False
    ) -> CriClient:
        """A CRI client on *socket* (default: containerd's), closed at :meth:`end_round`."""
        client = CriClient(
            socket if socket is not None else self.socket, timeout=timeout, wait_for_ready=wait_for_ready
        )
        self._round_clients.append(client)
        return client

    def new_cgroup_parent(self, qos: str = "burstable", uid: str | None = None) -> str:
        """A fresh pod cgroup parent under :attr:`cgroup_top`, removed at :meth:`end_round`.

        :param qos: ``guaranteed``, ``burstable`` or ``besteffort``.
        :param uid: pod UID; default a fresh UUID.
        """
        parent = pod_cgroup_parent(self.cgroup_top, qos, uid or str(uuid.uuid4()))
        self._round_parents.append(parent)
        return parent

    def begin_round(self) -> None:
        """Remember the pods that exist now; :meth:`end_round` leaves those alone."""
        with CriClient(self.socket) as client:
            self._round_pods = {pod.id for pod in client.list_pod_sandboxes()}

    def end_round(self) -> None:
        """Close the round's clients, remove pods created since :meth:`begin_round` and its cgroups."""
        for client in self._round_clients:
            client.close()
        self._round_clients.clear()
        if not self.ctrd.running:  # the round killed containerd (kill_daemon) and did not restart it
            self.ctrd.restart_daemon()
        with CriClient(self.socket) as client:
            for pod in client.list_pod_sandboxes():
                if pod.id not in self._round_pods:
                    with contextlib.suppress(Exception):
                        client.remove_pod(pod.id)
        for parent in self._round_parents:
            remove_cgroup_tree(parent, kill=True)
        self._round_parents.clear()
