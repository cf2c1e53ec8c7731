"""Hostile cgroup parents against kubelet's cgroup root: whatever a pod's parent says, the
parser answers a root or ``ValueError`` (never another exception), every path built from a
learned root stays below the cgroup mount, a hostile or disagreeing parent never moves the root
in use, and it costs only its own pod (logged, counted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from hooks.facts import (
    CgroupInfo,
    NodeFacts,
    PodFacts,
    is_safe_path_part,
    kube_qos_cgroup_path,
    parse_kubelet_pod_parent,
)
from hooks.plan import Plan
from runtime_proxy.host.apply import apply_files
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.state.kubelet_root import KubeletRoot

NAMES = st.sampled_from(["kubepods", "burstable", "besteffort", "pod1", "podx_y", "..", ".", "", "a-b", "a_b",
                         "c.slice", "kubepods-pod1.slice", "x\x00", "\n", "é", "custom"])
PARENTS = st.lists(NAMES, max_size=12).map(lambda names: "/".join(names)) | st.text(max_size=300)


@settings(max_examples=400, deadline=None)
@given(parent=PARENTS, driver=st.sampled_from(["cgroupfs", "systemd"]))
def test_any_parent_gives_a_safe_root_or_a_value_error(parent: str, driver: str) -> None:
    try:
        root = parse_kubelet_pod_parent(parent).root
    except ValueError:
        return
    for qos in ("Guaranteed", "Burstable", "BestEffort"):
        path = kube_qos_cgroup_path(qos, CgroupInfo(driver=driver, kubelet_root=root))
        assert is_safe_path_part(path) and ".." not in path.split("/"), (parent, root, path)


def test_a_megabyte_parent_is_refused_before_it_is_split() -> None:
    for parent in ("/" + "a" * (1 << 20) + "/kubepods/pod1", "/a" * 300_000 + "/kubepods/pod1"):
        try:
            parse_kubelet_pod_parent(parent)
        except ValueError as exc:
            assert "longer than 4096 bytes" in str(exc)
        else:
            raise AssertionError("a megabyte parent parsed")


HOSTILE = [
    "/../../etc/kubepods/besteffort/pod1",
    "/custom/../../kubepods/pod2",
    "/x\x00y/kubepods/pod3",
    "/" + "d/" * 3000 + "kubepods/pod4",
    "/1/2/3/4/5/6/7/8/9/kubepods/pod5",
    "/other.slice/evil-kubepods.slice/evil-kubepods-pod6.slice",
    "evil-kubepods-pod7.slice",
    "/elsewhere/kubepods/besteffort/pod8",
]


def test_hostile_parents_never_move_a_configured_root_and_are_each_logged_once() -> None:
    kr = KubeletRoot("/custom")
    pods = [PodFacts(name=f"h{i}", namespace="ns", uid=f"h{i}", sandbox_id=f"sb{i}", cgroup_parent=parent)
            for i, parent in enumerate(HOSTILE)]
    with capture_logs() as logs:
        for _ in range(3):
            assert kr.node(NodeFacts(), pods).cgroup.kubelet_root == "/custom"
    warned = [e for e in logs if e["event"] == "pod cgroup parent not used for kubelet's cgroup root"]
    assert sorted(e["uid"] for e in warned) == sorted(p.uid for p in pods)
    assert all(len(e["detail"]) < 300 for e in warned), "a hostile value is never echoed whole"


def test_a_few_hostile_pods_cannot_outvote_kubelets_own() -> None:
    """Learning: the root most pods show wins; a minority of pods under another root (or a
    hostile one) leaves it alone."""
    kr = KubeletRoot()
    own = [PodFacts(uid=f"k{i}", sandbox_id=f"k{i}", cgroup_parent=f"/custom/kubepods/besteffort/podk{i}")
           for i in range(3)]
    stray = [PodFacts(uid=f"s{i}", sandbox_id=f"s{i}", cgroup_parent=parent) for i, parent in enumerate(HOSTILE)]
    assert kr.node(NodeFacts(), own + stray).cgroup.kubelet_root == "/custom"


def test_writes_built_from_a_learned_root_stay_in_the_cgroup_mount(tmp_path: Path) -> None:
    """End to end through the applier: a QoS-level write under every root a pod could teach
    lands inside the cgroup tree or is refused; nothing outside it is created or written."""
    mount = tmp_path / "cgroup"
    (mount / "cpu").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    kr = KubeletRoot()
    for parent in [*HOSTILE, "/../outside/kubepods/besteffort/pod9", "/custom/kubepods/besteffort/pod10"]:
        node = kr.node(NodeFacts(), [PodFacts(uid="p", sandbox_id="p", cgroup_parent=parent)])
        plan = Plan()
        plan.write("kubeqos", kube_qos_cgroup_path("BestEffort", node.cgroup), "cpu.cfs_quota_us", 1000)
        apply_files(plan, cgroups=Cgroups(mount, version=1), missing_ok=True)
    assert list(outside.iterdir()) == []
    assert not any(p.is_file() for p in mount.rglob("*")), "QoS dirs that do not exist are not created"


def test_hostile_cgroup_parents_are_remembered_within_a_bound() -> None:
    """The loops' memory of pod paths (``cgroup_path_of_parent``) keeps at most 512 parents of at
    most CGROUP_PARENT_MAX_BYTES each: a parent longer than that is worked out every time and
    never kept, and a flood of distinct parents replaces older ones."""
    from hooks.facts import CGROUP_PARENT_MAX_BYTES, cgroup_path_of_parent
    from hooks.facts.cgroups import _remembered_path_of_parent

    _remembered_path_of_parent.cache_clear()
    huge = "/kubepods/burstable/pod" + "x" * (1 << 20)
    assert cgroup_path_of_parent(huge) == huge.strip("/")
    assert _remembered_path_of_parent.cache_info().currsize == 0
    for i in range(2000):
        cgroup_path_of_parent(f"/kubepods/burstable/pod{i}-" + "y" * (CGROUP_PARENT_MAX_BYTES - 40))
    assert _remembered_path_of_parent.cache_info().currsize <= 512


def test_hostile_cgroup_paths_are_remembered_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Cgroups`` remembers a file's place only on a cgroup filesystem, never one longer than
    PATH_MAX, and starts over before the names it keeps exceed its character budget."""
    from runtime_proxy.host import cgroups as cg

    tree = cg.Cgroups()
    if not tree._directory("kubepods", "cpu")[1]:
        pytest.skip("needs a cgroup filesystem at /sys/fs/cgroup")
    tree.file_path("kubepods/pod" + "z" * 5000, "cpu.shares")
    assert not tree._files, "a path longer than PATH_MAX is not remembered"
    monkeypatch.setattr(cg, "MAX_REMEMBERED_CHARS", 64 * 1024)
    for i in range(200):
        tree.file_path(f"kubepods/pod{i}-" + "w" * 1000, "cpu.shares")
        assert tree._files_chars <= 64 * 1024
        assert sum(len(p) + len(f) + 2 * len(v[2]) for (p, f), v in tree._files.items()) == tree._files_chars
