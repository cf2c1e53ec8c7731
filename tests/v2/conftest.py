"""The v2 tier: one cgroup v2 guest node (``rhp_devenv.v2node``) booted once per session.

Every test here is marked ``v2`` and runs in ``bash scripts/test.sh``. Without root or without
QEMU the tests skip with the reason; ``RHP_REQUIRE_V2=1`` (scripts/test.sh sets it) turns that
into a failure. The guest image comes from ``scripts/build-v2node.sh`` (``scripts/install-deps.sh``
runs it; cached under /opt/runtime-hook-proxy/v2node by the hash of its inputs).

At the end, the terminal summary shows the per-plugin tables the tests recorded, the boot time
and eth0's transmit counters on the host before and after the tier.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rhp_devenv.v2node import V2Node, build

from tests.v2.report import REPORT

REPO = Path(__file__).resolve().parents[2]
_V2_DIR = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _V2_DIR in item.path.parents:
            item.add_marker(pytest.mark.v2)
            item.add_marker(pytest.mark.timeout(1500))  # the first test also builds and boots the guest


def _tx(dev: str = "eth0") -> tuple[int, int] | None:
    stats = Path("/sys/class/net") / dev / "statistics"
    try:
        return int((stats / "tx_packets").read_text()), int((stats / "tx_bytes").read_text())
    except OSError:
        return None


def _unavailable(reason: str) -> None:
    if os.environ.get("RHP_REQUIRE_V2") == "1":
        pytest.fail(f"{reason} (RHP_REQUIRE_V2=1)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def v2node() -> Iterator[V2Node]:
    """The booted guest, shared by the whole session."""
    if os.geteuid() != 0:
        _unavailable("the v2 node needs root (mmdebstrap, QEMU's 9p shares of root-owned files)")
    if sys.version_info[:2] != (3, 11):
        _unavailable("the guest's python3 is bookworm's 3.11 and runs this .venv's wheels: needs CPython 3.11 here")
    if shutil.which("qemu-system-x86_64") is None:
        _unavailable("qemu-system-x86_64 is missing: run scripts/install-deps.sh")
    before = _tx()
    started = time.monotonic()
    build_dir = build(REPO)
    built = time.monotonic() - started
    node = V2Node(REPO, build_dir=build_dir)
    node.start()
    REPORT.append(f"v2 node: image {build_dir} ready in {built:.1f} s, booted in {node.boot_seconds:.1f} s")
    try:
        yield node
    finally:
        node.stop()
        after = _tx()
        REPORT.append(f"host eth0 tx (packets, bytes) before the v2 tier {before}, after {after} "
                      "(the whole machine's counter; the guest has no network device)")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.section("v2 node")
        for line in REPORT:
            terminalreporter.write_line(line)
