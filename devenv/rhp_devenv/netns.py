"""A private network namespace with only a loopback interface, for programs that must not reach
the network.

:class:`PrivateNetns` makes the namespace by starting ``unshare --net -- sleep infinity`` (the
holder), brings its ``lo`` up and gives :meth:`~PrivateNetns.command` to run other programs in it
with ``nsenter --net``. Everything started there can talk over loopback and unix sockets only: a
name lookup or a connection to anything else fails at once with "network is unreachable", so no
packet leaves the machine. Only the network namespace changes; mounts, cgroups and PIDs stay the
machine's own.

The namespace lives while any process is in it; :meth:`~PrivateNetns.stop` kills the holder by
PID (with ``die_with_parent``, the default, the holder also gets SIGKILL when the thread that
started it exits).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["NetnsError", "PrivateNetns", "pod_network_conflist"]


class NetnsError(RuntimeError):
    """The namespace could not be made (``unshare`` or ``ip`` missing or refused)."""


class PrivateNetns:
    """A network namespace with ``lo`` up, made and removed by this object (root only)::

        with PrivateNetns() as netns:
            subprocess.run(netns.command(["ip", "-o", "link"]))
    """

    def __init__(self, *, start_timeout: float = 10.0, die_with_parent: bool = True) -> None:
        self.start_timeout = start_timeout
        self.die_with_parent = die_with_parent
        self._holder: subprocess.Popen[bytes] | None = None

    @property
    def path(self) -> Path:
        """The namespace file, ``/proc/<holder>/ns/net``, for ``nsenter --net=`` or ``setns``."""
        if self._holder is None:
            raise RuntimeError("PrivateNetns is not started")
        return Path(f"/proc/{self._holder.pid}/ns/net")

    def command(self, argv: list[str]) -> list[str]:
        """*argv* prefixed to run in this namespace (``nsenter --net=PATH -- ARGV...``)."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def __enter__(self) -> PrivateNetns:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> PrivateNetns:
        """Start the holder, wait until it is in its own namespace, bring ``lo`` up.

        :raises NetnsError: a tool is missing, the holder died, or ``ip link set lo up`` failed.
        """
        if self._holder is not None:
            raise RuntimeError("PrivateNetns is already started")
        for tool in ("unshare", "nsenter", "ip"):
            if shutil.which(tool) is None:
                raise NetnsError(f"{tool} is not installed (util-linux, iproute2)")
        cmd = ["unshare", "--net", "--", "sleep", "infinity"]
        if self.die_with_parent and shutil.which("setpriv"):
            cmd = ["setpriv", "--pdeathsig", "KILL", "--", *cmd]
        self._holder = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, start_new_session=True)
        try:
            self._wait_unshared()
            up = subprocess.run(self.command(["ip", "link", "set", "lo", "up"]), capture_output=True,
                                text=True, stdin=subprocess.DEVNULL, timeout=self.start_timeout)
            if up.returncode != 0:
                raise NetnsError(f"ip link set lo up failed: {up.stderr.strip()}")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_unshared(self) -> None:
        """Poll until the holder's network namespace differs from ours (unshare has run)."""
        assert self._holder is not None
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._holder.poll() is not None:
                err = self._holder.stderr.read().decode(errors="replace") if self._holder.stderr else ""
                raise NetnsError(f"unshare --net exited with {self._holder.returncode}: {err.strip()}")
            with contextlib.suppress(OSError):
                if os.readlink(self.path) != ours:
                    return
            if time.monotonic() > deadline:
                raise NetnsError(f"unshare --net did not make a namespace within {self.start_timeout:.0f}s")
            time.sleep(0.01)

    def stop(self) -> None:
        """Kill the holder by PID (the namespace goes once nothing else is in it). Idempotent."""
        holder, self._holder = self._holder, None
        if holder is None:
            return
        if holder.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        if holder.stderr is not None:
            holder.stderr.close()


def pod_network_conflist(data_dir: Path, *, bridge: str = "rhp0", subnet: str = "172.31.250.0/24") -> dict[str, Any]:
    """A CNI config list giving each pod a veth on *bridge* and an address from *subnet*.

    For a containerd running inside a :class:`PrivateNetns` only: the bridge and the pods'
    addresses then exist in that namespace alone, which has no route to anywhere, so pod traffic
    stays there. No gateway, no masquerade, no port mapping. The IPAM leases go to *data_dir*
    (not the machine-wide ``/var/lib/cni``).
    """
    return {
        "cniVersion": "0.4.0",
        "name": "rhp-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": False,
                "ipMasq": False,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": str(data_dir)},
            },
            {"type": "loopback"},
        ],
    }
