"""kubelet's cgroup root in the node facts the hooks see: configured, or learned from the pods.

The QoS-level directories (``kubepods/besteffort`` and the like) sit below kubelet's
``cgroupRoot`` (``--cgroup-root``). The rule that picks the root is
``hooks.facts.choose_kubelet_root``: the proxy config's ``kubeletCgroupRoot`` when set, else
the root most stored pods' cgroup parents show (kubelet sends them in RunPodSandbox, NRI
carries them in the pod), else "/". ``KubeletRoot`` applies it: the proxy's interceptor
(``runtime_proxy.engine.lifecycle.Lifecycle.node``) and the NRI plugin
(``runtime_proxy.nri.adapter.NriEngine.node``) pass every ``NodeFacts`` they hand out through
``KubeletRoot.node`` with the pods of their store, so the reconciler, the burst loop and the
usage loop, which read the node facts there, follow it too.

A pod whose cgroup parent names another root, has the other driver's layout or is not a
kubelet pod cgroup never moves the root: it is logged once (with the pod's identity) and
counted in ``rhp_kubelet_cgroup_root_outliers_total``; its own pod-level paths still come from
its own parent. A change of the root in use is logged.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

import structlog
from prometheus_client import Counter

from hooks.facts import (
    KubeletPodParent,
    NodeFacts,
    PodFacts,
    choose_kubelet_root,
    parse_kubelet_cgroup_root,
    parse_kubelet_pod_parent,
)

__all__ = ["KubeletRoot"]

log = structlog.get_logger(__name__)

OUTLIERS = Counter(
    "rhp_kubelet_cgroup_root_outliers",
    "pods whose cgroup parent was not used for kubelet's cgroup root (another root, the other driver's "
    "layout, not a kubelet pod cgroup)",
    ["reason"],
)

# How many (pod, reason) pairs are remembered as logged; older ones may be logged again.
_LOGGED_MAX = 4096


class KubeletRoot:
    """Puts kubelet's cgroup root into ``NodeFacts.cgroup.kubelet_root``.

    :param configured: the proxy config's ``kubeletCgroupRoot``; "" learns it from the pods.
        ``ValueError`` when it is not a valid root (the config model has checked it already).
    """

    def __init__(self, configured: str = "") -> None:
        self.configured = parse_kubelet_cgroup_root(configured) if configured else ""
        self._cache: tuple[int, NodeFacts, NodeFacts] | None = None
        self._in_use: tuple[str, str] | None = None
        self._logged: OrderedDict[tuple[str, str], None] = OrderedDict()
        # The parse of every cgroup parent of the last round's pods (an error as its message):
        # a round parses only the parents it has not seen, and forgets those of pods gone.
        self._parsed: dict[str, KubeletPodParent | str] = {}

    def node(self, base: NodeFacts, pods: Sequence[PodFacts], version: int | None = None) -> NodeFacts:
        """``base`` with the root chosen over ``pods``; with ``version`` (the store's), the answer
        for the same version and the same ``base`` is reused."""
        cache = self._cache
        if version is not None and cache is not None and cache[0] == version and cache[1] is base:
            return cache[2]
        known = self._parsed
        seen: dict[str, KubeletPodParent | str] = {}

        def parse(parent: str) -> KubeletPodParent:
            got = seen.get(parent) or known.get(parent)
            if got is None:
                try:
                    got = parse_kubelet_pod_parent(parent)
                except ValueError as exc:
                    got = str(exc)
            seen[parent] = got
            if isinstance(got, str):
                raise ValueError(got)
            return got

        choice = choose_kubelet_root(self.configured, base.cgroup.driver, pods, parse)
        self._parsed = seen
        if self._in_use != (choice.root, choice.source):
            self._in_use = (choice.root, choice.source)
            log.info("kubelet cgroup root in use", root=choice.root, source=choice.source,
                     driver=base.cgroup.driver)
        for pod, reason, detail in choice.outliers:
            key = (pod.sandbox_id or pod.uid or pod.cgroup_parent[:256], reason)
            if key in self._logged:
                continue
            self._logged[key] = None
            if len(self._logged) > _LOGGED_MAX:
                self._logged.popitem(last=False)
            OUTLIERS.labels(reason).inc()
            log.warning("pod cgroup parent not used for kubelet's cgroup root", pod=f"{pod.namespace}/{pod.name}",
                        uid=pod.uid, sandbox_id=pod.sandbox_id, reason=reason, detail=detail,
                        root=choice.root, source=choice.source)
        node = base
        if base.cgroup.kubelet_root != choice.root:
            node = base.replace(cgroup=replace(base.cgroup, kubelet_root=choice.root))
        if version is not None:
            self._cache = (version, base, node)
        return node
