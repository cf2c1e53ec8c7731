"""A real cgroup v2 node on this machine: a QEMU guest (software emulation, no network).

The host here mounts cgroup v1 and its PID 1 is not systemd, so the product's v2 paths (the
unified tree, systemd slice names, ``cpu.max``, ``cpu.weight``, ``cpu.idle``, ``memory.*``) are
checked in a guest: Debian bookworm's kernel 6.1 with systemd 252 as PID 1, the project's
containerd 2.1 (``SystemdCgroup = true``, NRI on its default socket) and runc. The image is built
by ``scripts/build-v2node.sh`` (cached by the hash of its inputs under
``/opt/runtime-hook-proxy/v2node``); :class:`V2Node` boots it::

    with V2Node(repo=Path.cwd()) as node:           # builds when needed, boots (25-60 s)
        print(node.run("cat /sys/fs/cgroup/cgroup.controllers").stdout)
        (node.share / "x").write_text("hi")         # the guest sees /mnt/xfer/x
        node.run(node.python("-m", "runtime_proxy.cli", "doctor"))

- Commands: the guest's agent (``devenv/v2node/rhp-agent.sh``) runs the scripts the host puts
  into the shared directory's ``jobs/`` and answers with their output and exit code.
- Files: virtio-9p both ways: :attr:`V2Node.share` is ``/mnt/xfer`` in the guest; the repository
  (with its ``.venv``) is shared read-only at the same path, so the guest's Python runs the
  project's source and the wheels pip installed on the host (same CPython minor, 3.11).
- Network: none. QEMU runs with ``-nic none``: the guest has only ``lo``.
- The disk is opened with ``snapshot=on``: every boot starts from the built image.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["GUEST_SHARE", "Result", "V2Node", "V2NodeError", "build"]

DEFAULT_PREFIX = Path(os.environ.get("RHP_V2NODE_PREFIX", "/opt/runtime-hook-proxy/v2node"))
GUEST_SHARE = "/mnt/xfer"
"""Where the guest mounts :attr:`V2Node.share`."""
_QEMU = "qemu-system-x86_64"
_BUSYBOX = "/usr/bin/busybox"
GUEST_ADDRESS = "10.0.2.15"
"""The guest's address on QEMU's user-mode network (only with forwards)."""
GUEST_FORWARD_ADDRESS = "10.0.2.100"
"""Where the guest reaches the forwards to the host's 127.0.0.1 (QEMU's ``guestfwd``)."""


class V2NodeError(RuntimeError):
    """The guest could not be built, booted or reached."""


@dataclass(frozen=True)
class Result:
    """What a command in the guest gave."""

    rc: int
    stdout: str
    stderr: str

    def check(self) -> Result:
        if self.rc != 0:
            raise V2NodeError(f"guest command failed (exit {self.rc}): {self.stderr.strip()[-2000:]}")
        return self


def build(repo: Path) -> Path:
    """Run ``scripts/build-v2node.sh`` (nothing to do when the inputs are unchanged): the
    directory holding ``vmlinuz``, ``initrd.img`` and ``rootfs.img``. Its progress lines go to
    this process's stderr."""
    proc = subprocess.run(
        ["bash", str(repo / "scripts" / "build-v2node.sh")],
        stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, check=False,
    )
    if proc.returncode != 0:
        raise V2NodeError(f"scripts/build-v2node.sh failed (exit {proc.returncode})")
    return Path(proc.stdout.strip().splitlines()[-1])


class V2Node:
    """One booted guest; a context manager (:meth:`start`, :meth:`stop`)."""

    def __init__(self, repo: Path, *, build_dir: Path | None = None, cpus: int = 2, memory_mb: int = 2048,
                 boot_timeout: float = 300.0, forwards: Sequence[tuple[int, int]] = ()) -> None:
        """:param forwards: (guest port, host port) pairs: a connection from the guest to
            ``GUEST_FORWARD_ADDRESS:<guest port>`` reaches ``127.0.0.1:<host port>`` on the host.
            Without any the guest has no network device; with some it has one NIC on QEMU's
            user-mode stack with ``restrict=on`` (no other address is reachable) and only these
            forwards (``guestfwd``, each connection bridged by ``busybox nc``)."""
        self.repo = repo.resolve()
        self.forwards = tuple((int(g), int(h)) for g, h in forwards)
        self.build_dir = build_dir
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.boot_timeout = boot_timeout
        self.work_dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.boot_seconds: float | None = None
        self._next_job = 0

    # -- life cycle -------------------------------------------------------------------------------
    def __enter__(self) -> V2Node:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def share(self) -> Path:
        """The host side of the guest's ``/mnt/xfer``."""
        if self.work_dir is None:
            raise V2NodeError("the v2 node is not started")
        return self.work_dir / "xfer"

    @property
    def console(self) -> Path:
        """The guest's serial console log."""
        if self.work_dir is None:
            raise V2NodeError("the v2 node is not started")
        return self.work_dir / "console.log"

    def command(self, build_dir: Path) -> list[str]:
        """The QEMU command line (pure, for the docs and the no-network test)."""
        assert self.work_dir is not None
        append = " ".join([
            "console=ttyS0", "root=/dev/vda", "rw", "quiet", "systemd.unified_cgroup_hierarchy=1",
            "systemd.show_status=0", f"rhp.repo={self.repo}",
        ])
        return [
            _QEMU, "-accel", "tcg,thread=multi", "-cpu", "max", "-smp", str(self.cpus), "-m", str(self.memory_mb),
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", *self._network(),
            "-serial", f"file:{self.console}",
            "-kernel", str(build_dir / "vmlinuz"), "-initrd", str(build_dir / "initrd.img"), "-append", append,
            "-drive", f"file={build_dir / 'rootfs.img'},if=virtio,format=raw,snapshot=on",
            "-virtfs", f"local,path={self.share},mount_tag=xfer,security_model=none",
            "-virtfs", f"local,path={self.repo},mount_tag=repo,security_model=none,readonly=on",
        ]

    def _network(self) -> list[str]:
        """No NIC at all, or one on QEMU's user-mode stack restricted to the explicit forwards."""
        if not self.forwards:
            return ["-nic", "none"]
        fwds = ",".join(f"guestfwd=tcp:{GUEST_FORWARD_ADDRESS}:{g}-cmd:{_BUSYBOX} nc 127.0.0.1 {h}"
                        for g, h in self.forwards)
        return ["-netdev", f"user,id=n0,restrict=on,{fwds}", "-device", "virtio-net-pci,netdev=n0"]

    def network_up(self) -> None:
        """Bring the guest's NIC up (``GUEST_ADDRESS``) for the forwards; nothing without them."""
        if self.forwards:
            # virtio_net is loaded by the initrd (the root has no /lib/modules)
            self.run(f"for i in $(seq 100); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done; "
                     f"busybox ip link set eth0 up && busybox ip addr add {GUEST_ADDRESS}/24 dev eth0",
                     timeout=120, check=True)

    def start(self) -> V2Node:
        if shutil.which(_QEMU) is None:
            raise V2NodeError(f"{_QEMU} is missing: run scripts/install-deps.sh")
        build_dir = self.build_dir or build(self.repo)
        self.work_dir = Path(tempfile.mkdtemp(prefix="rhp-v2node-", dir="/tmp"))
        (self.share / "jobs").mkdir(parents=True)
        self._write_sitecustomize()
        started = time.monotonic()
        env = {**os.environ, "TMPDIR": str(self.work_dir)}  # the snapshot's overlay lives here
        with open(self.work_dir / "qemu.log", "wb") as log:
            self.proc = subprocess.Popen(self.command(build_dir), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, env=env, start_new_session=True)
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        self.boot_seconds = time.monotonic() - started
        return self

    def _wait_ready(self, started: float) -> None:
        assert self.proc is not None
        ready = self.share / "ready"
        while not ready.exists():
            if self.proc.poll() is not None:
                raise V2NodeError(f"qemu exited ({self.proc.returncode}) before the guest was ready: "
                                  f"{self._tail()}")
            if time.monotonic() - started > self.boot_timeout:
                raise V2NodeError(f"the guest was not ready in {self.boot_timeout:.0f} s: {self._tail()}")
            time.sleep(0.2)

    def _tail(self) -> str:
        text = ""
        for name in ("qemu.log", "console.log"):
            path = (self.work_dir or Path("/nonexistent")) / name
            if path.exists():
                text += f"\n--- {name} ---\n" + path.read_text(errors="replace")[-3000:]
        return text

    def stop(self) -> None:
        """Power the guest off (QEMU is killed when it does not stop in 30 s); remove the work
        directory. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                self._submit("systemctl poweroff --no-block\n")
                proc.wait(30)
            except (subprocess.TimeoutExpired, OSError):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)
            self.work_dir = None

    # -- commands ---------------------------------------------------------------------------------
    def _write_sitecustomize(self) -> None:
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        site_packages = self.repo / ".venv" / "lib" / version / "site-packages"
        py = self.share / "py"
        py.mkdir()
        (py / "sitecustomize.py").write_text(
            "import site\n"
            f"site.addsitedir({str(site_packages)!r})\n"
        )

    def python(self, *args: str) -> str:
        """A guest shell command running the guest's python3 with the project and its
        dependencies (the repository's ``.venv`` over 9p) on its path."""
        pythonpath = f"{GUEST_SHARE}/py:{self.repo}"
        return (f"PYTHONPATH={shlex.quote(pythonpath)} PYTHONDONTWRITEBYTECODE=1 "
                f"python3 {' '.join(shlex.quote(a) for a in args)}")

    def _submit(self, script: str) -> Path:
        self._next_job += 1
        jobs = self.share / "jobs"
        job = jobs / f"{self._next_job:05d}"
        tmp = jobs / f".{self._next_job:05d}.tmp"
        tmp.write_text(script)
        tmp.rename(job.with_suffix(".sh"))
        return job

    def run(self, script: str, timeout: float = 300.0, check: bool = False) -> Result:
        """Run *script* with bash in the guest (as root, cwd ``/``) and wait for it."""
        if self.proc is None or self.proc.poll() is not None:
            raise V2NodeError("the v2 node is not running")
        job = self._submit(script)
        rc_file = job.with_suffix(".rc")
        deadline = time.monotonic() + timeout
        while not rc_file.exists():
            if self.proc.poll() is not None:
                raise V2NodeError(f"qemu exited ({self.proc.returncode}) during a command: {self._tail()}")
            if time.monotonic() > deadline:
                raise V2NodeError(f"guest command did not finish in {timeout:.0f} s: {script[:200]!r}")
            time.sleep(0.1)
        result = Result(
            rc=int(rc_file.read_text().strip() or "255"),
            stdout=job.with_suffix(".out").read_text(errors="replace"),
            stderr=job.with_suffix(".err").read_text(errors="replace"),
        )
        return result.check() if check else result
