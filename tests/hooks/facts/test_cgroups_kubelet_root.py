"""kubelet's cgroup root in ``hooks.facts``: the QoS directories below it for both drivers, the
parsers of the root and of a pod's cgroup parent, and the one rule that chooses the root."""

from __future__ import annotations

import pytest

from hooks.facts import (
    CgroupInfo,
    KubeletPodParent,
    PodFacts,
    choose_kubelet_root,
    host_app_cgroup_path,
    is_safe_path_part,
    kube_qos_cgroup_path,
    kube_qos_from_cgroup_parent,
    parse_kubelet_cgroup_root,
    parse_kubelet_pod_parent,
)

SYSTEMD_BE_CUSTOM = "custom.slice/custom-kubepods.slice/custom-kubepods-besteffort.slice"


@pytest.mark.parametrize(
    ("description", "kube_qos", "driver", "root", "expected"),
    [
        ("cgroupfs, default root: guaranteed pods sit in kubepods itself", "Guaranteed", "cgroupfs", "/", "kubepods"),
        ("cgroupfs, default root, burstable", "Burstable", "cgroupfs", "/", "kubepods/burstable"),
        ("cgroupfs, default root, besteffort", "BestEffort", "cgroupfs", "/", "kubepods/besteffort"),
        ("systemd, default root", "Guaranteed", "systemd", "/", "kubepods.slice"),
        ("systemd, default root, besteffort", "BestEffort", "systemd", "/",
         "kubepods.slice/kubepods-besteffort.slice"),
        ("cgroupfs, /custom: kubelet appends kubepods to the root", "BestEffort", "cgroupfs", "/custom",
         "custom/kubepods/besteffort"),
        ("cgroupfs, a two-level root", "Burstable", "cgroupfs", "/a/b", "a/b/kubepods/burstable"),
        ("systemd, /custom: every name joins the slice chain", "BestEffort", "systemd", "/custom", SYSTEMD_BE_CUSTOM),
        ("systemd, /custom, guaranteed", "Guaranteed", "systemd", "/custom", "custom.slice/custom-kubepods.slice"),
        ("systemd, a two-level root", "Burstable", "systemd", "/a/b",
         "a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-burstable.slice"),
        ("systemd escapes '-' in a name as '_'", "Guaranteed", "systemd", "/my-root",
         "my_root.slice/my_root-kubepods.slice"),
        ("the root is normalised: no leading slash, trailing slash", "BestEffort", "cgroupfs", "custom/",
         "custom/kubepods/besteffort"),
    ],
)
def test_kube_qos_cgroup_path(description: str, kube_qos: str, driver: str, root: str, expected: str) -> None:
    assert kube_qos_cgroup_path(kube_qos, CgroupInfo(driver=driver, kubelet_root=root)) == expected, description


def test_a_bare_driver_name_means_the_default_root() -> None:
    assert kube_qos_cgroup_path("BestEffort", "systemd") == "kubepods.slice/kubepods-besteffort.slice"
    assert kube_qos_cgroup_path("BestEffort") == "kubepods/besteffort"


@pytest.mark.parametrize(
    ("description", "base", "driver", "expected"),
    [
        ("KubepodsBesteffort follows the root (cgroupfs)", "KubepodsBesteffort", "cgroupfs",
         "custom/kubepods/besteffort/agents/a"),
        ("KubepodsBesteffort follows the root (systemd)", "KubepodsBesteffort", "systemd",
         f"{SYSTEMD_BE_CUSTOM}/agents/a"),
        ("Kubepods follows the root", "Kubepods", "cgroupfs", "custom/kubepods/agents/a"),
        ("CgroupRoot is the cgroup mount, not kubelet's root", "CgroupRoot", "cgroupfs", "agents/a"),
    ],
)
def test_host_app_bases_follow_the_kubelet_root(description: str, base: str, driver: str, expected: str) -> None:
    app = {"name": "a", "qos": "LS", "cgroupPath": {"base": base, "parentDir": "agents", "relativePath": "a"}}
    assert host_app_cgroup_path(app, CgroupInfo(driver=driver, kubelet_root="/custom")) == expected, description


@pytest.mark.parametrize(
    ("description", "text", "expected"),
    [
        ("empty is kubelet's default", "", "/"),
        ("the default itself", "/", "/"),
        ("a plain root", "/custom", "/custom"),
        ("no leading slash, as ParseCgroupfsToCgroupName reads it", "custom", "/custom"),
        ("trailing and doubled slashes dropped", "//a//b/", "/a/b"),
        ("dots inside a name are a name", "/a.b/c..d", "/a.b/c..d"),
        ("eight names", "/1/2/3/4/5/6/7/8", "/1/2/3/4/5/6/7/8"),
        ("255 bytes", "/" + "x" * 254, "/" + "x" * 254),
    ],
)
def test_parse_kubelet_cgroup_root(description: str, text: str, expected: str) -> None:
    assert parse_kubelet_cgroup_root(text) == expected, description


@pytest.mark.parametrize(
    ("description", "text", "message"),
    [
        ("'..' would leave the cgroup mount", "/a/../../etc", "'..' is not a cgroup name"),
        ("'.' is not a name", "/a/./b", "'.' is not a cgroup name"),
        ("NUL", "/a\x00b", "NUL"),
        ("a control character", "/a\nb", "control character"),
        ("longer than 255 bytes", "/" + "x" * 255, "longer than 255 bytes"),
        ("255 characters that are more bytes", "/" + "é" * 200, "longer than 255 bytes"),
        ("nine names", "/1/2/3/4/5/6/7/8/9", "deeper than 8 names"),
        ("not a string", 7, "must be a string"),
    ],
)
def test_parse_kubelet_cgroup_root_refuses(description: str, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_kubelet_cgroup_root(text)


def test_cgroup_info_refuses_a_bad_root_when_made() -> None:
    with pytest.raises(ValueError, match="is not a cgroup name"):
        CgroupInfo(kubelet_root="/..")
    assert CgroupInfo(kubelet_root="custom/").kubelet_root == "/custom"


@pytest.mark.parametrize(
    ("description", "parent", "expected"),
    [
        ("cgroupfs, default root", "/kubepods/burstable/pod1", KubeletPodParent("/", "cgroupfs", "Burstable")),
        ("cgroupfs guaranteed", "/kubepods/pod1", KubeletPodParent("/", "cgroupfs", "Guaranteed")),
        ("cgroupfs under /custom", "/custom/kubepods/besteffort/pod12-34",
         KubeletPodParent("/custom", "cgroupfs", "BestEffort")),
        ("cgroupfs under a two-level root", "/a/b/kubepods/pod1", KubeletPodParent("/a/b", "cgroupfs", "Guaranteed")),
        ("a root named kubepods is read from the end", "/kubepods/kubepods/burstable/pod1",
         KubeletPodParent("/kubepods", "cgroupfs", "Burstable")),
        ("a root named burstable is not a tier", "/burstable/kubepods/pod1",
         KubeletPodParent("/burstable", "cgroupfs", "Guaranteed")),
        ("systemd short form, default root", "kubepods-burstable-pod12_34.slice",
         KubeletPodParent("/", "systemd", "Burstable")),
        ("systemd short form under /custom", "custom-kubepods-besteffort-pod1.slice",
         KubeletPodParent("/custom", "systemd", "BestEffort")),
        ("systemd full form, as kubelet sends it, under /custom",
         f"/{SYSTEMD_BE_CUSTOM}/custom-kubepods-besteffort-pod12_34.slice",
         KubeletPodParent("/custom", "systemd", "BestEffort")),
        ("systemd '_' in a root name reads back as '-'", "my_root-kubepods-pod1.slice",
         KubeletPodParent("/my-root", "systemd", "Guaranteed")),
    ],
)
def test_parse_kubelet_pod_parent(description: str, parent: str, expected: KubeletPodParent) -> None:
    assert parse_kubelet_pod_parent(parent) == expected, description
    assert kube_qos_from_cgroup_parent(parent) == expected.kube_qos, description


@pytest.mark.parametrize(
    ("description", "parent", "message"),
    [
        ("empty", "", "empty"),
        ("only slashes", "///", "empty"),
        ("no pod<uid> at the end", "/custom/kubepods/burstable", "pod<uid>"),
        ("'pod' without a uid", "/kubepods/pod", "pod<uid>"),
        ("no kubepods above the pod", "/custom/burstable/pod1", "no kubepods"),
        ("a tier without kubepods above it", "/custom/besteffort/pod1", "no kubepods"),
        ("'..' escapes", "/../../kubepods/pod1", "'..' is not a cgroup name"),
        ("'..' inside the root", "/a/../kubepods/besteffort/pod1", "'..' is not a cgroup name"),
        ("NUL", "/custom\x00/kubepods/pod1", "NUL"),
        ("a control character", "/cus\ttom/kubepods/pod1", "control character"),
        ("longer than PATH_MAX", "/" + "a/" * 2100 + "kubepods/pod1", "longer than 4096 bytes"),
        ("a root deeper than eight names", "/1/2/3/4/5/6/7/8/9/kubepods/pod1", "deeper than 8 names"),
        ("a root longer than 255 bytes", "/" + "r" * 300 + "/kubepods/pod1", "longer than 255 bytes"),
        ("a systemd path whose directories are not its slice's expansion",
         "/other.slice/custom-kubepods.slice/custom-kubepods-pod1.slice", "not the expansion"),
        ("a systemd path that climbs", "/../custom-kubepods-pod1.slice", "'..' is not a cgroup name"),
        ("an empty systemd name", "custom--kubepods-pod1.slice", "bad systemd slice name"),
    ],
)
def test_parse_kubelet_pod_parent_refuses(description: str, parent: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_kubelet_pod_parent(parent)


def p(parent: str, uid: str = "u") -> PodFacts:
    return PodFacts(name=uid, namespace="ns", uid=uid, sandbox_id=f"sb-{uid}", cgroup_parent=parent)


CUSTOM_BE = "/custom/kubepods/besteffort/pod{}"
DEFAULT_BE = "/kubepods/besteffort/pod{}"


@pytest.mark.parametrize(
    ("description", "configured", "driver", "parents", "root", "source", "outliers"),
    [
        ("no pods: kubelet's default", "", "cgroupfs", [], "/", "default", []),
        ("pods without a parent say nothing", "", "cgroupfs", [""], "/", "default", []),
        ("learned from the pods", "", "cgroupfs", [CUSTOM_BE.format(1), CUSTOM_BE.format(2)], "/custom", "pods", []),
        ("the configured root wins over the pods", "/custom", "cgroupfs", [DEFAULT_BE.format(1)], "/custom",
         "config", [("1", "other-root")]),
        ("the configured root, pods agreeing", "/custom", "cgroupfs", [CUSTOM_BE.format(1)], "/custom", "config", []),
        ("most pods decide", "", "cgroupfs", [CUSTOM_BE.format(1), CUSTOM_BE.format(2), DEFAULT_BE.format(3)],
         "/custom", "pods", [("3", "other-root")]),
        ("a tie goes to the smaller text", "", "cgroupfs", [CUSTOM_BE.format(1), DEFAULT_BE.format(2)], "/",
         "pods", [("1", "other-root")]),
        ("a hostile parent never moves the root", "", "cgroupfs", ["/../../etc/kubepods/pod1", CUSTOM_BE.format(2)],
         "/custom", "pods", [("1", "not-kubelet")]),
        ("a non-kubelet parent (crictl) is an outlier, not a vote", "", "cgroupfs", ["/mine"], "/", "default",
         [("1", "not-kubelet")]),
        ("the other driver's layout is not learned from", "", "cgroupfs", ["custom-kubepods-pod1.slice"], "/",
         "default", [("1", "other-driver")]),
        ("systemd learns from systemd parents", "", "systemd",
         [f"/{SYSTEMD_BE_CUSTOM}/custom-kubepods-besteffort-pod1.slice"], "/custom", "pods", []),
        ("under systemd /a-b and /a_b are one directory", "/a_b", "systemd", ["a_b-kubepods-pod1.slice"], "/a_b",
         "config", []),
    ],
)
def test_choose_kubelet_root(description: str, configured: str, driver: str, parents: list[str], root: str,
                             source: str, outliers: list[tuple[str, str]]) -> None:
    pods = [p(parent, str(i + 1)) for i, parent in enumerate(parents)]
    choice = choose_kubelet_root(configured, driver, pods)
    assert (choice.root, choice.source) == (root, source), description
    assert [(o[0].uid, o[1]) for o in choice.outliers] == outliers, description


def test_choose_refuses_a_bad_configured_root() -> None:
    with pytest.raises(ValueError, match=r"'\.\.' is not a cgroup name"):
        choose_kubelet_root("/..", "cgroupfs", [])


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
@pytest.mark.parametrize("parent", [
    "/a/kubepods/pod1", "/x.y/kubepods/besteffort/pod1", "/ a /kubepods/burstable/pod1", "-kubepods-pod1.slice",
    "a-b-c-d-e-f-g-h-kubepods-pod1.slice", "/..a/kubepods/pod1",
])
def test_every_learned_root_keeps_the_qos_paths_below_the_mount(driver: str, parent: str) -> None:
    """Whatever a pod's parent parses to, the QoS paths built from its root are relative and
    never climb."""
    try:
        root = parse_kubelet_pod_parent(parent).root
    except ValueError:
        return
    for qos in ("Guaranteed", "Burstable", "BestEffort"):
        assert is_safe_path_part(kube_qos_cgroup_path(qos, CgroupInfo(driver=driver, kubelet_root=root)))


@pytest.mark.parametrize(
    ("description", "parent", "expected"),
    [
        ("a root named after a tier does not make every pod that tier", "/besteffort-pool/kubepods/burstable/pod1",
         "Burstable"),
        ("a guaranteed pod under a root named burstable", "/burstable/kubepods/pod1", "Guaranteed"),
        ("systemd, the same", "burstable_x-kubepods-besteffort-pod1.slice", "BestEffort"),
        ("a parent of another shape keeps the word rule", "/x/besteffort/y", "BestEffort"),
        ("nothing kubelet-like", "/mine", ""),
    ],
)
def test_kube_qos_from_cgroup_parent_reads_after_the_last_kubepods(description: str, parent: str,
                                                                   expected: str) -> None:
    assert kube_qos_from_cgroup_parent(parent) == expected, description
