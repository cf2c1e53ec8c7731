"""Run inside the v2 node by ``tests/v2/test_v2_kubelet.py``: start or stop one door of the
product in front of the guest's containerd for the guest's kubelet, with the node config and
built-in plugins of ``guest_scenario.py``.

    python3 tests/v2/guest_door.py start serve|nri   # prints the socket kubelet uses
    python3 tests/v2/guest_door.py stop serve|nri

``start`` returns once the door answers (the proxy's Version, the NRI plugin's Synchronize) and
leaves it running; its PID goes to ``/run/rhp-<door>/door.pid``, its log to
``/run/rhp-<door>/<door>.log``. ``stop`` ends that PID (SIGTERM, then SIGKILL after 30 s).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.v2

from tests.v2 import guest_scenario as gs


def _work(door: str) -> Path:
    return Path(f"/run/rhp-{door}")


def start(door: str) -> None:
    work = _work(door)
    work.mkdir(parents=True, exist_ok=True)
    gs.wait_for("containerd", lambda: Path(gs.CONTAINERD).exists(), 180)
    try:
        # generous: the door's imports and first answer under emulation on a loaded host
        proc = gs.start_door(door, work, timeout=900)
    except Exception:
        log = work / f"{door}.log"
        print(log.read_text(errors="replace")[-6000:] if log.exists() else "(no log)", file=sys.stderr)
        raise
    (work / "door.pid").write_text(str(proc.pid))
    print(work / "proxy.sock" if door == "serve" else gs.CONTAINERD)


def stop(door: str) -> None:
    pid = int((_work(door) / "door.pid").read_text())
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    action, which = sys.argv[1], sys.argv[2]
    if which not in ("serve", "nri"):
        raise SystemExit(f"unknown door {which!r}")
    {"start": start, "stop": stop}[action](which)
