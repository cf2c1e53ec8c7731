"""The private network namespace of the development environment (``rhp_devenv.netns``), and a
private containerd started inside it with a pod network that exists only there.

Only state is read (links, routes, namespace links): no packet is sent.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from rhp_devenv.containerd import PrivateContainerd, available_versions
from rhp_devenv.cri import CriClient
from rhp_devenv.netns import PrivateNetns, pod_network_conflist

pytestmark = pytest.mark.integration


def _in(netns: PrivateNetns, *argv: str) -> str:
    return subprocess.run(netns.command(list(argv)), capture_output=True, text=True, check=True,
                          stdin=subprocess.DEVNULL, timeout=30).stdout


@pytest.fixture
def netns() -> Iterator[PrivateNetns]:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a network namespace")
    with PrivateNetns() as made:
        yield made


def test_namespace_has_only_loopback_and_no_route(netns: PrivateNetns) -> None:
    links = _in(netns, "ip", "-o", "link", "show").splitlines()
    assert len(links) == 1 and ": lo:" in links[0] and "UP" in links[0], links
    assert _in(netns, "ip", "-4", "route", "show").strip() == ""
    assert "default" not in _in(netns, "ip", "-6", "route", "show")
    assert os.readlink(netns.path) != os.readlink("/proc/self/ns/net")


def test_stop_ends_the_holder() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a network namespace")
    netns = PrivateNetns().start()
    path = netns.path
    netns.stop()
    netns.stop()  # idempotent
    assert not path.exists()
    with pytest.raises(RuntimeError):
        _ = netns.path


def test_containerd_runs_inside_with_a_pod_network_there(netns: PrivateNetns, tmp_path: Path) -> None:
    versions = available_versions()
    if not versions:
        pytest.skip("no containerd installed")
    conflist = pod_network_conflist(tmp_path / "ipam")
    with PrivateContainerd(versions[-1], netns=netns.path, cni_conflist=conflist) as ctrd:
        assert ctrd.pid is not None
        assert os.readlink(f"/proc/{ctrd.pid}/ns/net") == os.readlink(netns.path)
        with CriClient(ctrd.socket, timeout=30.0) as cri:
            conditions = {c.type: c.status for c in cri.status().status.conditions}
        assert conditions["NetworkReady"], conditions
    assert not (Path("/var/lib/cni/networks") / conflist["name"]).exists()
