"""kubelet's cgroup layout, the product's one copy of it: where a pod, a container, a QoS tier and
a host application live below a cgroup root (cgroupfs and systemd drivers), kubelet's cgroup root
(``CgroupInfo.kubelet_root``, parsed, or read back from pods' cgroup parents) and the Kubernetes
QoS class a cgroup parent implies. Pure string work: every path part a pod can influence is
checked so a path never leaves its root (``ValueError``). Import the names from ``hooks.facts``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from koord_formats import keys, nodeslo


class CgroupOwner(Protocol):
    """What the layout needs of a pod: kubelet's cgroup parent (``hooks.facts.PodFacts`` is one)."""

    @property
    def cgroup_parent(self) -> str: ...


# The pods ``choose_kubelet_root`` is given and hands back as outliers (``PodFacts`` in the product).
PodT = TypeVar("PodT", bound=CgroupOwner)

# ---- cgroup paths of pods and containers ---------------------------------------------------


def is_safe_path_part(part: str) -> bool:
    """True for a relative path that stays below its root: no "..", no NUL, not absolute."""
    if not part or "\x00" in part or part.startswith("/"):
        return False
    return all(p not in ("..",) for p in part.split("/"))


def _expand_systemd_slice(name: str) -> str:
    # kubelet's cgroupManager: "a-b-c.slice" lives at "a.slice/a-b.slice/a-b-c.slice".
    if not name.endswith(".slice"):
        raise ValueError(f"{name!r} is not a systemd slice name")
    stem = name[: -len(".slice")]
    if stem in ("", "-"):
        return ""
    if "/" in stem or stem.startswith("-") or stem.endswith("-") or "--" in stem:
        raise ValueError(f"bad systemd slice name {name!r}")
    words = stem.split("-")
    return "/".join("-".join(words[: i + 1]) + ".slice" for i in range(len(words)))


def cgroup_path_of_parent(cgroup_parent: str) -> str:
    """The filesystem path, relative to a controller's root, of a kubelet cgroup parent.

    ``/kubepods/burstable/pod<uid>`` (cgroupfs) -> ``kubepods/burstable/pod<uid>``;
    ``kubepods-burstable-pod<uid>.slice`` (systemd) ->
    ``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice``.
    Raises ``ValueError`` for a parent that would leave the root ("..", NUL, empty parts).
    Remembered for the last 512 parents of at most ``CGROUP_PARENT_MAX_BYTES`` (a pure function
    of the string; the loops ask for every pod's path every second): a longer one, which no
    kubelet makes, and a refused one are worked out again every time, so hostile parents cost
    at most 512 x 4 KiB.
    """
    if len(cgroup_parent) <= CGROUP_PARENT_MAX_BYTES:
        return _remembered_path_of_parent(cgroup_parent)
    return _path_of_parent(cgroup_parent)


def _path_of_parent(cgroup_parent: str) -> str:
    text = cgroup_parent.strip()
    if "\x00" in text:
        raise ValueError("cgroup parent contains NUL")
    path = _expand_systemd_slice(text) if text.endswith(".slice") and "/" not in text else text.strip("/")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise ValueError(f"cgroup parent {cgroup_parent!r} contains '..'")
    if not parts:
        raise ValueError(f"empty cgroup parent {cgroup_parent!r}")
    return "/".join(parts)


_remembered_path_of_parent = lru_cache(maxsize=512)(_path_of_parent)


def _check_id(kind: str, value: str) -> str:
    if not value or "/" in value or "\x00" in value or value in (".", ".."):
        raise ValueError(f"bad {kind} {value!r}")
    return value


def pod_cgroup_path(pod: CgroupOwner) -> str:
    """The pod's cgroup directory relative to the cgroup root (``ValueError`` if unsafe)."""
    return cgroup_path_of_parent(pod.cgroup_parent)


def container_cgroup_path(pod: CgroupOwner, container_id: str, driver: str = "cgroupfs") -> str:
    """Where containerd puts a container (or sandbox) of ``pod``: ``<pod>/<id>`` with cgroupfs,
    ``<pod slice>/cri-containerd-<id>.scope`` with systemd."""
    base = pod_cgroup_path(pod)
    cid = _check_id("container id", container_id)
    if driver == "systemd" or base.endswith(".slice"):
        return f"{base}/cri-containerd-{cid}.scope"
    return f"{base}/{cid}"


# ---- kubelet's cgroup root and its QoS directories ---------------------------------------------
#
# kubelet names a cgroup by a list of names (pkg/kubelet/cm). container_manager_linux.go reads
# ``cgroupRoot`` (always written in the cgroupfs form, "/a/b" -> ["a", "b"]) and appends
# "kubepods"; qos_container_manager_linux.go appends "burstable" or "besteffort" for those two
# tiers (Guaranteed pods sit in kubepods itself); a pod adds "pod<uid>". cgroup_manager_linux.go
# lays a name out for the cgroupfs driver as "/" + "/".join(names), and for the systemd driver
# (``ToSystemd``) replaces "-" by "_" in every name, joins the names with "-", adds ".slice" and
# expands the slice: ["custom", "kubepods", "burstable"] lives at
# custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice. The pod's cgroup parent
# that kubelet sends (RunPodSandbox, NRI) is its pod name laid out the same way. The functions
# below are the product's one copy of that rule: the QoS-level paths come from the root, and the
# root can be read back from a pod's cgroup parent.

KUBELET_ROOT_MAX_BYTES = 255
KUBELET_ROOT_MAX_NAMES = 8
# A cgroup parent longer than PATH_MAX is not one kubelet could have made.
CGROUP_PARENT_MAX_BYTES = 4096
_KUBEPODS = "kubepods"
_QOS_TIERS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"Guaranteed": (), "Burstable": ("burstable",), "BestEffort": ("besteffort",)}
)
_TIER_QOS: Mapping[str, str] = MappingProxyType({"burstable": "Burstable", "besteffort": "BestEffort"})


def _shown(text: str) -> str:
    """``text`` for an error message: quoted, and cut when long (input may be hostile)."""
    return repr(text) if len(text) <= 80 else repr(text[:77]) + "..."


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _check_text(text: str, what: str) -> None:
    if "\x00" in text:
        raise ValueError(f"{what} contains NUL")
    found = _CONTROL.search(text)
    if found is not None:
        raise ValueError(f"{what}: a control character ({found.group()!r}) in {_shown(text)}")


def _check_names(names: Sequence[str], what: str) -> None:
    for name in names:
        if name in (".", ".."):
            raise ValueError(f"{what}: {name!r} is not a cgroup name")


def parse_kubelet_cgroup_root(text: str) -> str:
    """kubelet's ``cgroupRoot`` normalised: "/" or "/a/b" (one leading slash, no empty names).

    Accepts what kubelet's ``ParseCgroupfsToCgroupName`` reads ("custom", "/custom/" are
    "/custom"; "" is "/"). ``ValueError`` for a value that is not a string, is longer than
    ``KUBELET_ROOT_MAX_BYTES`` bytes or ``KUBELET_ROOT_MAX_NAMES`` names, holds NUL or another
    control character, or a "." or ".." name: nothing derived from it can leave the cgroup mount.
    """
    if not isinstance(text, str):
        raise ValueError(f"kubelet cgroup root must be a string, not {type(text).__name__}")
    if len(text) > KUBELET_ROOT_MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > KUBELET_ROOT_MAX_BYTES:
        raise ValueError(f"kubelet cgroup root longer than {KUBELET_ROOT_MAX_BYTES} bytes")
    _check_text(text, "kubelet cgroup root")
    names = [n for n in text.split("/") if n]
    if len(names) > KUBELET_ROOT_MAX_NAMES:
        raise ValueError(f"kubelet cgroup root deeper than {KUBELET_ROOT_MAX_NAMES} names")
    _check_names(names, "kubelet cgroup root")
    return "/" + "/".join(names)


def _layout(names: Sequence[str], driver: str) -> str:
    """A kubelet cgroup name as a path relative to a controller's root (see above)."""
    if driver == "systemd":
        escaped = [n.replace("-", "_") for n in names]
        return "/".join("-".join(escaped[: i + 1]) + ".slice" for i in range(len(escaped)))
    return "/".join(names)


@lru_cache(maxsize=256)
def _qos_path(kube_qos: str, driver: str, root: str) -> str:
    names = [n for n in root.split("/") if n]
    return _layout([*names, _KUBEPODS, *_QOS_TIERS[kube_qos]], driver)


def _cgroup_info(cgroup: CgroupInfo | str) -> CgroupInfo:
    return cgroup if isinstance(cgroup, CgroupInfo) else CgroupInfo(driver=cgroup)


def kube_qos_cgroup_path(kube_qos: str, cgroup: CgroupInfo | str = "cgroupfs") -> str:
    """kubelet's QoS directory relative to a controller's root ("Guaranteed" is the kubepods
    directory itself), below the node's kubelet cgroup root: ``node.cgroup`` (a ``CgroupInfo``);
    a bare driver name ("cgroupfs", "systemd") means kubelet's default root "/".

    ``kube_qos_cgroup_path("BestEffort", CgroupInfo(driver="systemd", kubelet_root="/custom"))``
    is ``custom.slice/custom-kubepods.slice/custom-kubepods-besteffort.slice``."""
    info = _cgroup_info(cgroup)
    return _qos_path(kube_qos, "systemd" if info.driver == "systemd" else "cgroupfs", info.kubelet_root)


def kubelet_root_key(root: str, driver: str) -> str:
    """What two kubelet cgroup roots are compared by: the kubepods directory each gives under
    ``driver`` (under systemd "/a-b" and "/a_b" are the same directory)."""
    return _qos_path("Guaranteed", "systemd" if driver == "systemd" else "cgroupfs", root)


@dataclass(frozen=True)
class KubeletPodParent:
    """What a kubelet pod cgroup parent says: kubelet's cgroup root (``parse_kubelet_cgroup_root``
    form), the driver whose layout the parent has, and the pod's Kubernetes QoS class."""

    root: str
    driver: str
    kube_qos: str


def _pod_names(names: Sequence[str]) -> tuple[Sequence[str], str]:
    """Split kubelet's pod cgroup name into (root names, QoS class), reading from the end."""
    if not names or len(names[-1]) <= len("pod") or not names[-1].startswith("pod"):
        raise ValueError("not a kubelet pod cgroup: the last name is not pod<uid>")
    if len(names) >= 2 and names[-2] == _KUBEPODS:
        return names[:-2], "Guaranteed"
    if len(names) >= 3 and names[-2] in _TIER_QOS and names[-3] == _KUBEPODS:
        return names[:-3], _TIER_QOS[names[-2]]
    raise ValueError("not a kubelet pod cgroup: no kubepods[/burstable|/besteffort] above the pod")


def parse_kubelet_pod_parent(cgroup_parent: str) -> KubeletPodParent:
    """Read a pod's cgroup parent as kubelet makes it: cgroupfs ``/custom/kubepods/burstable/pod<uid>``
    or systemd ``/custom.slice/custom-kubepods.slice/custom-kubepods-burstable.slice/
    custom-kubepods-burstable-pod<uid_>.slice`` (or that last name alone), giving root "/custom".

    Total and bounded: ``ValueError`` for anything else (empty, longer than
    ``CGROUP_PARENT_MAX_BYTES``, NUL or control characters, "." or "..", a systemd path whose
    directories are not the expansion of its last name, no ``kubepods`` above ``pod<uid>``, a
    root ``parse_kubelet_cgroup_root`` refuses)."""
    if not isinstance(cgroup_parent, str) or not cgroup_parent.strip("/"):
        raise ValueError("empty cgroup parent")
    if len(cgroup_parent) > CGROUP_PARENT_MAX_BYTES:
        raise ValueError(f"cgroup parent longer than {CGROUP_PARENT_MAX_BYTES} bytes")
    _check_text(cgroup_parent, "cgroup parent")
    dirs = [n for n in cgroup_parent.split("/") if n]
    _check_names(dirs, "cgroup parent")
    if dirs[-1].endswith(".slice"):
        driver = "systemd"
        escaped = dirs[-1][: -len(".slice")].split("-")
        if "" in escaped:
            raise ValueError(f"bad systemd slice name {_shown(dirs[-1])}")
        if len(dirs) > 1 and "/".join(dirs) != _layout(escaped, "systemd"):
            raise ValueError(f"systemd cgroup parent {_shown(cgroup_parent)} is not the expansion of its last slice")
        # kubelet's ParseSystemdToCgroupName: "_" was "-" in the name.
        names: Sequence[str] = [n.replace("_", "-") for n in escaped]
    else:
        driver, names = "cgroupfs", dirs
    root_names, kube_qos = _pod_names(names)
    return KubeletPodParent(parse_kubelet_cgroup_root("/" + "/".join(root_names)), driver, kube_qos)


@dataclass(frozen=True)
class KubeletRootChoice(Generic[PodT]):
    """``choose_kubelet_root``'s answer: the root in use, where it came from (``config``, ``pods``
    or ``default``), and the pods left out of it with why (``other-root``: the parent is under
    another root; ``other-driver``: it has the other driver's layout; ``not-kubelet``: it is not
    a kubelet pod cgroup; the text says more), for the caller to log."""

    root: str
    source: str
    outliers: tuple[tuple[PodT, str, str], ...] = ()


def choose_kubelet_root(
    configured: str,
    driver: str,
    pods: Iterable[PodT],
    parse: Callable[[str], KubeletPodParent] = parse_kubelet_pod_parent,
) -> KubeletRootChoice[PodT]:
    """kubelet's cgroup root for the QoS-level paths, by one rule:

    1. ``configured`` (the proxy config's ``kubeletCgroupRoot``), when not empty, is the root;
    2. else the root that most pods' cgroup parents show (``parse_kubelet_pod_parent``, in
       ``driver``'s layout), ties going to the smaller text (so "/" before "/custom");
    3. else "/", kubelet's default.

    A pod whose parent names another root, has the other driver's layout or is not a kubelet pod
    cgroup is an outlier: it never moves the root. Pods without a cgroup parent are left out
    silently. ``parse`` is ``parse_kubelet_pod_parent`` or a memo of it (the caller's, so a
    round over many pods parses only the new parents). ``ValueError`` only when ``configured``
    is not a valid root."""
    want = "systemd" if driver == "systemd" else "cgroupfs"
    fixed = parse_kubelet_cgroup_root(configured) if configured else ""
    outliers: list[tuple[PodT, str, str]] = []
    seen: list[tuple[PodT, KubeletPodParent]] = []
    for p in pods:
        if not p.cgroup_parent:
            continue
        try:
            parsed = parse(p.cgroup_parent)
        except ValueError as exc:
            outliers.append((p, "not-kubelet", str(exc)))
            continue
        if parsed.driver != want:
            outliers.append((p, "other-driver", f"cgroup parent in the {parsed.driver} layout, {want} configured"))
            continue
        seen.append((p, parsed))
    if fixed:
        root, source = fixed, "config"
    else:
        votes = Counter(kubelet_root_key(parsed.root, want) for _, parsed in seen)
        roots = {kubelet_root_key(parsed.root, want): parsed.root for _, parsed in reversed(seen)}
        if votes:
            best = min(votes, key=lambda k: (-votes[k], roots[k]))
            root, source = roots[best], "pods"
        else:
            root, source = "/", "default"
    key = kubelet_root_key(root, want)
    for p, parsed in seen:
        if kubelet_root_key(parsed.root, want) != key:
            outliers.append((p, "other-root", f"cgroup parent under kubelet cgroup root {parsed.root}, {root} in use"))
    return KubeletRootChoice(root, source, tuple(outliers))


def host_app_cgroup_path(
    app: nodeslo.HostApplication | Mapping[str, Any], cgroup: CgroupInfo | str = "cgroupfs"  # Any: JSON, decoded here
) -> str:
    """Koordinator's ``GetHostAppCgroupRelativePath``: base dir / parentDir / relativePath, or
    ``host-latency-sensitive/<name>`` (LSE/LSR/LS) / ``host-best-effort/<name>`` (BE) when no
    ``cgroupPath`` is given. The ``Kubepods*`` bases are kubelet's QoS directories below the
    node's kubelet cgroup root (``kube_qos_cgroup_path``; ``cgroup`` as there). ``ValueError``
    for a path that would leave the cgroup root; a mapping is decoded first (``FormatError``
    when it is not a host application)."""
    if not isinstance(app, nodeslo.HostApplication):
        app = nodeslo.host_application(app)
    cgp = app.cgroup_path
    if cgp is None:
        if app.qos in (keys.QOS_LSE, keys.QOS_LSR, keys.QOS_LS):
            parts = ["host-latency-sensitive", app.name]
        elif app.qos == keys.QOS_BE:
            parts = ["host-best-effort", app.name]
        else:
            parts = []
    else:
        base_dir = {
            keys.HOST_APP_BASE_CGROUP_ROOT: "",
            keys.HOST_APP_BASE_KUBEPODS: kube_qos_cgroup_path("Guaranteed", cgroup),
            keys.HOST_APP_BASE_KUBEPODS_BURSTABLE: kube_qos_cgroup_path("Burstable", cgroup),
            keys.HOST_APP_BASE_KUBEPODS_BESTEFFORT: kube_qos_cgroup_path("BestEffort", cgroup),
        }[cgp.base]
        parts = [base_dir, cgp.parent_dir, cgp.relative_path]
    pieces: list[str] = []
    for part in parts:
        if "\x00" in part:
            raise ValueError("host application path contains NUL")
        for piece in part.split("/"):
            if piece in ("", "."):
                continue
            if piece == "..":
                raise ValueError(f"host application path {'/'.join(parts)!r} escapes the cgroup root")
            pieces.append(piece)
    return "/".join(pieces)


def kube_qos_from_cgroup_parent(cgroup_parent: str) -> str:
    """Kubernetes QoS class implied by a pod's cgroup parent, as kubelet lays it out.

    Works for the cgroupfs form (``/kubepods/burstable/pod<uid>``) and the systemd form
    (``kubepods-burstable-pod<uid>.slice``), under any kubelet cgroup root: the words
    ``besteffort`` or ``burstable`` after the last ``kubepods``, else ``kubepods`` itself.
    Returns "" when none is there.
    """
    lowered = cgroup_parent.lower()
    # Only what follows the last "kubepods" names the tier (a root may hold the words too).
    lowered = lowered[max(lowered.rfind(_KUBEPODS), 0):]
    if "besteffort" in lowered:
        return "BestEffort"
    if "burstable" in lowered:
        return "Burstable"
    if "kubepods" in lowered:
        return "Guaranteed"
    return ""


@dataclass(frozen=True)
class CgroupInfo:
    """How the node's cgroups are laid out."""

    version: int = 1  # 1 or 2
    driver: str = "cgroupfs"  # "cgroupfs" or "systemd"
    # kubelet's cgroup root (``cgroupRoot``, ``--cgroup-root``) in kubelet's own form, the
    # cgroupfs one whatever the driver: "/" (kubelet's default) or "/custom". The QoS-level
    # directories sit below it (``kube_qos_cgroup_path``). Normalised when the value is made;
    # ``ValueError`` for one kubelet could not use (``parse_kubelet_cgroup_root``).
    kubelet_root: str = "/"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kubelet_root", parse_kubelet_cgroup_root(self.kubelet_root))
