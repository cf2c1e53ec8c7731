"""rdt: cache (L3 CAT) and memory-bandwidth (MBA) isolation between QoS classes, and per pod.

Stages
    ``reconcile_node`` (class groups ``LSR``, ``LS``, ``BE`` and their schemata),
    ``pre_run_pod_sandbox`` (pod group ``koordlet-<podUID>`` and its schemata),
    ``post_run_pod_sandbox`` (the sandbox's tasks join the pod's group),
    ``post_start_container`` (the container's tasks join its group, synchronously, at start —
    not minutes later as Koordinator's async loop, issue #756), ``reconcile_pod`` and
    ``reconcile_container`` (schemata and task moves again: new threads join),
    ``post_remove_pod_sandbox`` (the pod group goes away with its pod),
    ``reconcile_resctrl_groups`` (pod groups whose pod the proxy no longer knows are removed:
    ``stale_pod_groups``).
Inputs
    NodeSLO ``resourceQOSStrategy.{lsrClass,lsClass,beClass}.resctrlQOS.{enable,
    catRangeStartPercent,catRangeEndPercent,mbaPercent}`` (defaults LSR/LS 0-100 and 100, BE
    0-30 and 100, ``enable`` false); ``node.resctrl`` (root ``cbm_mask``, L3 ``cache_ids``,
    ``vendor``); pod label ``koordinator.sh/qosClass`` with the kube-QoS fallback (LSE pods use
    LSR); pod annotation ``node.koordinator.sh/resctrl`` (``{"llc":{"schemata":{"range":[20,80]},
    "schemataPerCache":[{"cacheID":0,"range":[20,50]}]},"mb":{"schemata":{"percent":20},
    "schemataPerCache":[{"cacheID":1,"percent":40}]}}``).
Schemata math (Koordinator)
    ways = bit length of the root cbm; startWay = ceil(ways x start/100), endWay = ceil(ways x
    end/100); mask = (1 << endWay) - (1 << startWay) in hex; line ``L3:<id>=<mask>;...;``.
    MB: percent 1-100; Intel rounds up to a multiple of 10; AMD: 100 -> 2048 (unlimited), else
    floor(160 x percent / 100); line ``MB:<id>=<v>;...;``.
Refusals (Koordinator ``CalculateCatL3MaskValue``, ``calculateMbaPercentForGroup``)
    a root cbm that is not a contiguous block of ones from bit 0 (``0x101``, ``0x4``) or not a
    32-bit hex number, a cache range with a percentage outside 0-100 or an end not above its
    start, an MB percentage outside 1-100: that line is not written and the reason is recorded
    as a skip; the group's other line is still written.
Outputs
    writes ``resctrl``/``<group>``/``schemata``; moves of ``container``/``sandbox`` tasks;
    removal of ``resctrl``/``koordlet-<podUID>`` (at pod removal, and for stale groups).
Leaves alone
    classes whose resctrlQOS is not enabled, SYSTEM pods, the root group, monitoring groups.
    Without resctrl facts (no resctrl on the node) it records one skip and plans nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Set
from types import MappingProxyType

from hooks.facts import ContainerFacts, NodeFacts, PodFacts, container_cgroup_path
from hooks.plan import Plan
from hooks.spec import hookimpl
from koord_formats import keys
from koord_formats.keys import SLO
from koord_formats.pod import PodResctrl, parse_pod_resctrl

# The resctrl groups koordlet keeps per QoS class (named after the class) and their NodeSLO section.
CLASS_GROUPS = MappingProxyType({keys.QOS_LSR: SLO.LSR_CLASS, keys.QOS_LS: SLO.LS_CLASS, keys.QOS_BE: SLO.BE_CLASS})
# LSE pods share the LSR group.
GROUP_OF_QOS = MappingProxyType({
    keys.QOS_LSE: keys.QOS_LSR,
    keys.QOS_LSR: keys.QOS_LSR,
    keys.QOS_LS: keys.QOS_LS,
    keys.QOS_BE: keys.QOS_BE,
})
POD_GROUP_PREFIX = "koordlet-"
AMD_MB_UNLIMITED = 2048
AMD_MB_MAX_GBPS = 160
_HEX = frozenset("0123456789abcdefABCDEF")


def root_ways(cbm_mask: str) -> int:
    """The number of L3 ways of the root ``cbm_mask`` (``ValueError`` for a mask koordlet
    refuses: not 1 to 8 hex digits (it reads the mask as a 32-bit number), or not a contiguous
    block of ones from bit 0 (``0x101``, ``0x4``, ``0``); x86 needs contiguous masks and the
    root group holds every way)."""
    text = cbm_mask.strip()
    if not 1 <= len(text) <= 8 or any(ch not in _HEX for ch in text):
        raise ValueError(f"root cbm mask {cbm_mask[:32]!r} is not 1 to 8 hex digits")
    cbm = int(text, 16)
    if cbm == 0 or cbm & (cbm + 1):
        raise ValueError(f"root cbm mask {text!r} is not a contiguous block of ways from way 0")
    return cbm.bit_length()


def l3_mask(cbm_mask: str, start_percent: int, end_percent: int) -> str:
    """The L3 capacity bitmask for a range of ways, in hex (``ValueError`` with the reason when
    koordlet would refuse it: a bad root mask, a percentage outside 0-100, an end not above the
    start, or a range too narrow to hold a way)."""
    ways = root_ways(cbm_mask)
    if not 0 <= start_percent < end_percent <= 100:
        raise ValueError(f"bad cache range {start_percent}-{end_percent}% (0 <= start < end <= 100)")
    start_way = math.ceil(ways * start_percent / 100)
    end_way = math.ceil(ways * end_percent / 100)
    mask = (1 << end_way) - (1 << start_way)
    if mask <= 0:
        raise ValueError(f"cache range {start_percent}-{end_percent}% of {ways} ways is empty")
    return format(mask, "x")


def mb_value(percent: int, vendor: str) -> int:
    """The MB schemata value for a bandwidth percentage (``ValueError`` outside 1-100)."""
    if isinstance(percent, bool) or not isinstance(percent, int) or not 1 <= percent <= 100:
        raise ValueError(f"mba percent {percent!r} must be 1-100")
    if vendor == "amd":
        return AMD_MB_UNLIMITED if percent == 100 else AMD_MB_MAX_GBPS * percent // 100
    return math.ceil(percent / 10) * 10


def _line(resource: str, values: Mapping[int, str | int]) -> str:
    return f"{resource}:" + "".join(f"{cid}={v};" for cid, v in sorted(values.items()))


def class_schemata(node: NodeFacts, class_key: str) -> tuple[str, list[str]]:
    """The schemata of a class group and why a part of it was refused. As koordlet, the L3 and
    MB lines are decided apart: a refused one is left out (its current value stays) and the
    other is still written; "" when both are refused."""
    q = node.rules.resctrl_qos(class_key)
    rc = node.resctrl
    ids = rc.cache_ids or (0,)
    lines: list[str] = []
    refused: list[str] = []
    try:
        mask = l3_mask(rc.cbm_mask, q.cat_range_start_percent, q.cat_range_end_percent)
        lines.append(_line("L3", {i: mask for i in ids}) + "\n")
    except ValueError as exc:
        refused.append(f"L3 not written: {exc}")
    try:
        mb = mb_value(q.mba_percent, rc.vendor)
        lines.append(_line("MB", {i: mb for i in ids}) + "\n")
    except ValueError as exc:
        refused.append(f"MB not written: {exc}")
    return "".join(lines), refused


def pod_schemata(config: PodResctrl, node: NodeFacts) -> str:
    """The schemata of a pod group from its ``node.koordinator.sh/resctrl`` annotation
    (``ValueError`` when a range or percentage cannot be applied to this node's caches)."""
    rc = node.resctrl
    ids = rc.cache_ids or (0,)
    lines: list[str] = []
    if config.llc is not None:
        per_id: dict[int, str] = {}
        for i in ids:
            rng = config.llc.per_cache.get(i, config.llc.default)
            start, end = rng if isinstance(rng, tuple) else (0, 100)
            per_id[i] = l3_mask(rc.cbm_mask, start, end)
        lines.append(_line("L3", per_id))
    if config.mb is not None:
        mb_ids: dict[int, int] = {}
        for i in ids:
            pct = config.mb.per_cache.get(i, config.mb.default)
            mb_ids[i] = mb_value(pct if isinstance(pct, int) else 100, rc.vendor)
        lines.append(_line("MB", mb_ids))
    return "\n".join(lines) + "\n"


def pod_group_name(pod: PodFacts) -> str:
    if not pod.uid or "/" in pod.uid or "\x00" in pod.uid or pod.uid in (".", ".."):
        raise ValueError(f"bad pod uid {pod.uid!r}")
    return POD_GROUP_PREFIX + pod.uid


def has_pod_group(pod: PodFacts) -> bool:
    return bool(pod.annotations.get(keys.ANNOTATION_POD_RESCTRL))


def group_of(pod: PodFacts, node: NodeFacts) -> str | None:
    """The resctrl group the pod's tasks belong in, None for "none"."""
    if has_pod_group(pod):
        try:
            return pod_group_name(pod)
        except ValueError:
            return None
    group = GROUP_OF_QOS.get(pod.qos_class)
    if group is None or not node.rules.resctrl_qos(CLASS_GROUPS[group]).enable:
        return None
    return group


def _facts_ok(node: NodeFacts, plan: Plan) -> bool:
    if not node.resctrl.cbm_mask:
        plan.skip("resctrl is not available on this node (no L3 cbm mask)")
        return False
    return True


def _pod_group_plan(pod: PodFacts, node: NodeFacts) -> Plan:
    plan = Plan()
    if not has_pod_group(pod) or not _facts_ok(node, plan):
        return plan
    try:
        config = parse_pod_resctrl(pod.annotations[keys.ANNOTATION_POD_RESCTRL])
        plan.write("resctrl", pod_group_name(pod), "schemata", pod_schemata(config, node))
    except ValueError as exc:
        plan.skip(f"pod {pod.namespace}/{pod.name}: bad {keys.ANNOTATION_POD_RESCTRL}: {exc}")
    return plan


def _move(plan: Plan, pod: PodFacts, node: NodeFacts, level: str, cid: str) -> Plan:
    if not cid or not node.resctrl.cbm_mask:
        return plan
    group = group_of(pod, node)
    if group is None:
        return plan
    try:
        plan.move_tasks(level, container_cgroup_path(pod, cid, node.cgroup.driver), group)
    except ValueError as exc:
        plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
    return plan


@hookimpl
def rhp_reconcile_node(node: NodeFacts) -> Plan | None:
    plan = Plan()
    enabled = [g for g, key in CLASS_GROUPS.items() if node.rules.resctrl_qos(key).enable]
    if not enabled or not _facts_ok(node, plan):
        return plan
    for group in enabled:
        schemata, refused = class_schemata(node, CLASS_GROUPS[group])
        for reason in refused:
            plan.skip(f"resctrl group {group}: {reason}")
        if schemata:
            plan.write("resctrl", group, "schemata", schemata)
    return plan


@hookimpl
def rhp_pre_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    return _pod_group_plan(pod, node)


@hookimpl
def rhp_post_run_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    return _move(Plan(), pod, node, "sandbox", pod.sandbox_id)


@hookimpl
def rhp_post_start_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _move(Plan(), pod, node, "container", container.id)


@hookimpl
def rhp_reconcile_pod(pod: PodFacts, node: NodeFacts) -> Plan | None:
    return _move(_pod_group_plan(pod, node), pod, node, "sandbox", pod.sandbox_id)


@hookimpl
def rhp_reconcile_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    return _move(Plan(), pod, node, "container", container.id)


@hookimpl
def rhp_post_remove_pod_sandbox(pod: PodFacts, node: NodeFacts) -> Plan | None:
    plan = Plan()
    if has_pod_group(pod):
        try:
            plan.remove("resctrl", pod_group_name(pod))
        except ValueError as exc:
            plan.skip(f"pod {pod.namespace}/{pod.name}: {exc}")
    return plan


def stale_pod_groups(existing: Iterable[str], live_pod_uids: Set[str]) -> list[str]:
    """Pod-level groups (``koordlet-<uid>``) whose pod is gone."""
    return [g for g in existing if g.startswith(POD_GROUP_PREFIX) and g[len(POD_GROUP_PREFIX):] not in live_pod_uids]


@hookimpl
def rhp_reconcile_resctrl_groups(pods: tuple[PodFacts, ...], resctrl_groups: tuple[str, ...]) -> Plan | None:
    plan = Plan()
    for group in stale_pod_groups(resctrl_groups, {p.uid for p in pods if p.uid}):
        plan.remove("resctrl", group)
    return plan
