"""The filter, prioritize and preempt verbs over many candidate nodes (bind: ``scheduler_ext.binder``).

Who calls this: ``scheduler_ext.server`` (the HTTP verbs). Each takes the cluster lock once
per call and asks ``scheduler_ext.decide`` for every candidate's verdict: the hot path reads the
pod kind's memo table for all names at once and computes only the misses.

With load-aware scheduling configured (``ClusterState.load_args``), filter also refuses the
nodes ``scheduler_ext.loadaware.filter_reason`` refuses (Unschedulable: ``FailedNodes``), and
prioritize adds the load score: a pod the allocation does not score (it needs no cpuset, NUMA
alignment or GPU) gets the load score scaled to 0..10, any other the mean of both. These are
judged on every call, never memoised: they depend on the clock (a NodeMetric expires).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from koord_formats import keys
from scheduler_ext import loadaware
from scheduler_ext.admission import Intent, pre_filter
from scheduler_ext.decide import MAX_SCORE, ExtenderConfig, Verdict, key_id, memo_verdict, verdict_of
from scheduler_ext.pods import PodRequest
from scheduler_ext.state import ClusterState, NodeState
from scheduler_ext.views import matched_reservations

__all__ = ["FilterResult", "filter_nodes", "preempt_nodes", "prioritize_nodes"]


@dataclass(frozen=True, slots=True)
class FilterResult:
    """The filter verb's answer: nodes that passed, failed (preemption may help) and unresolvable."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


def _verdicts(
    state: ClusterState, pod: PodRequest, names: Sequence[str], cfg: ExtenderConfig
) -> list[Verdict | None]:
    """The verdict of every candidate (``None``: not in the cache); caller holds the lock.

    Hot path (500 names per call, twice per pod): one ``map`` over the kind's memo table in C,
    then ``memo_verdict`` only for the misses, typically the nodes changed since the last call.
    """
    kid = key_id(pod, cfg)
    memo: Mapping[str, Verdict] = state.memo.get(kid) or {}
    out: list[Verdict | None] = list(map(memo.get, names))
    if None in out:
        get = state.nodes.get
        for i, v in enumerate(out):
            if v is None:
                ns = get(names[i])
                if ns is not None:
                    out[i] = memo_verdict(ns, pod, cfg, kid)
    return out


def filter_nodes(
    state: ClusterState, pod: PodRequest, names: Sequence[str], cfg: ExtenderConfig
) -> FilterResult:
    """Split candidate names into passed, failed (preemption may help) and unresolvable."""
    if pod.error:
        return FilterResult([], {}, dict.fromkeys(names, pod.error))
    with state.lock:
        verdicts = _verdicts(state, pod, names, cfg)
        loaded = _load_refusals(state, pod, names)
    passed = [n for n, v in zip(names, verdicts, strict=True) if v is not None and v.ok and n not in loaded]
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if len(passed) == len(names):
        return FilterResult(passed, failed, unresolvable)
    plain = _plain_anywhere(pod)
    passed = []  # again, in the candidates' order
    for name, v in zip(names, verdicts, strict=True):
        if v is None:
            if plain:
                passed.append(name)  # nothing of ours to check: an unknown node cannot refuse it
            else:
                failed[name] = f"node {name} is not in the extender's cache yet"
        elif v.ok:
            if name in loaded:
                failed[name] = loaded[name]
            else:
                passed.append(name)
        elif v.unresolvable:
            unresolvable[name] = v.reason
        else:
            failed[name] = v.reason
    return FilterResult(passed, failed, unresolvable)


def _assigned(ns: NodeState, pod: PodRequest) -> list[loadaware.PodLoad]:
    return [load for uid, load in ns.bound.items() if uid != pod.uid]


def _existing(state: ClusterState, ns: NodeState, pod: PodRequest) -> loadaware.Existing:
    """The node's usage before ``pod`` (``loadaware.existing_used``), remembered on the node
    until a pod is bound to it or leaves it or its NodeMetric changes; a pod counted on the node
    already (a bind in flight being retried) is left out, without the memo."""
    args, metric = state.load_args, ns.metric
    assert args is not None and metric is not None
    if pod.uid and pod.uid in ns.bound:
        assigned = _assigned(ns, pod)
        return lambda base, prod: loadaware.existing_used(args, metric, assigned, base, prod=prod)
    tag = ns.bound_version
    if ns.load_memo[0] != tag:
        ns.load_memo = (tag, {})
    memo = ns.load_memo[1]

    def existing(base: Mapping[str, int] | None, prod: bool) -> Mapping[str, int]:
        key = (None if base is None else tuple(sorted(base.items())), prod)
        got = memo.get(key)
        if got is None:
            got = memo[key] = loadaware.existing_used(args, metric, ns.bound.values(), base, prod=prod)
        return got

    return existing


def _incoming(state: ClusterState, pod: PodRequest) -> loadaware.PodLoad:
    """The pod being scheduled as load-aware scheduling estimates it: what the pod watch read
    of it (requests and limits of its priority class's resources), else, for a pod the watch
    has not shown yet, its decoded request (cpu and memory requests only)."""
    entry = state.pods.get(pod.uid) if pod.uid else None
    if entry is not None and entry.load is not None:
        return entry.load
    return loadaware.PodLoad(
        namespace=pod.namespace,
        name=pod.name,
        cpu_request=pod.cpu_milli,
        memory_request=pod.memory,
        prod=pod.priority_class == keys.PRIORITY_PROD,
        daemonset=any(o.kind == "DaemonSet" for o in pod.identity.owner_refs),
    )


def _load_refusals(state: ClusterState, pod: PodRequest, names: Sequence[str]) -> dict[str, str]:
    """The candidates load-aware filtering refuses, with the reason; caller holds the lock."""
    args = state.load_args
    if args is None:
        return {}
    load = _incoming(state, pod)
    now = state.wall()
    get = state.nodes.get
    out: dict[str, str] = {}
    for name in names:
        ns = get(name)
        if ns is None or ns.metric is None:
            continue  # no NodeMetric: load-aware filtering lets the pod pass
        reason = loadaware.filter_reason(args, load, ns.load, ns.metric, (), now, existing=_existing(state, ns, pod))
        if reason:
            out[name] = reason
    return out


def _load_scores(state: ClusterState, pod: PodRequest, names: Sequence[str]) -> list[int] | None:
    """Each candidate's load score 0..100 (None: load-aware scheduling is off); caller holds the lock."""
    args = state.load_args
    if args is None:
        return None
    load = _incoming(state, pod)
    now = state.wall()
    get = state.nodes.get
    out: list[int] = []
    for name in names:
        ns = get(name)
        if ns is None or ns.metric is None:
            out.append(0)
        else:
            out.append(loadaware.score(args, load, ns.load, ns.metric, (), now, existing=_existing(state, ns, pod)))
    return out


def _plain_anywhere(pod: PodRequest) -> bool:
    """True when no node label could make this pod need anything from us: it requests
    nothing (a node's bind-policy label binds any CPU request, its NUMA policy label aligns
    any request)."""
    intent = pre_filter(pod)
    return isinstance(intent, Intent) and intent.skip and pod.reservation_affinity is None


def prioritize_nodes(
    state: ClusterState, pod: PodRequest, names: Sequence[str], cfg: ExtenderConfig
) -> list[tuple[str, int]]:
    """Scores 0..10 by the configured strategy; infeasible or unknown nodes score 0."""
    if pod.error:
        return [(name, 0) for name in names]
    with state.lock:
        verdicts = _verdicts(state, pod, names, cfg)
        loads = _load_scores(state, pod, names)
    scores = [v.score if v is not None and v.ok else 0 for v in verdicts]
    if loads is not None:
        scale = loadaware.MAX_LOAD_SCORE // MAX_SCORE  # load scores are 0..100, ours 0..10
        if _plain_anywhere(pod):
            scores = [(la + scale // 2) // scale for la in loads]  # rounded
        else:
            scores = [(scale * s + la + scale) // (2 * scale) for s, la in zip(scores, loads, strict=True)]
        scores = [s if v is None or v.ok else 0 for s, v in zip(scores, verdicts, strict=True)]
    return list(zip(names, scores, strict=True))


def preempt_nodes(
    state: ClusterState,
    pod: PodRequest,
    victims: Mapping[str, Sequence[str]],
    cfg: ExtenderConfig,
) -> dict[str, list[str]]:
    """Keep the nodes where evicting the given victims (pod UIDs) lets ``pod`` fit. A victim
    allocated from a reservation ``pod`` does not match is never evicted for it (what it holds
    stays the reservation's): it is dropped from the node's victims, and the node is kept only
    when the others are enough."""
    out: dict[str, list[str]] = {}
    with state.lock:
        for name, given in victims.items():
            ns = state.nodes.get(name)
            uids = _outside_reservations(state, ns, pod, given)
            if not uids:
                continue  # kube-scheduler rejects a node returned without victims
            if ns is None:
                if _plain_anywhere(pod):
                    out[name] = list(uids)
                continue
            saved = {u: ns.allocs[u] for u in uids if u in ns.allocs and u not in ns.held}
            for u in saved:
                del ns.allocs[u]
            ns.touch()
            try:
                ok = _evaluate_uncached(ns, pod, cfg).ok
            finally:
                ns.allocs.update(saved)
                ns.touch()
            if ok:
                out[name] = list(uids)
    return out


def _outside_reservations(
    state: ClusterState, ns: NodeState | None, pod: PodRequest, uids: Sequence[str]
) -> list[str]:
    """``uids`` without the pods allocated from a reservation on the node that ``pod`` may not
    use (caller holds the lock)."""
    if ns is None or not ns.reservations:
        return list(uids)
    ns.refresh()
    mine = {nr.r.uid for nr in matched_reservations(ns, pod)}
    out: list[str] = []
    for u in uids:
        entry = state.pods.get(u)
        owner = entry.alloc.reservation if entry is not None else ""
        if owner and owner in ns.reservations and owner not in mine:
            continue
        out.append(u)
    return out


def _evaluate_uncached(ns: NodeState, pod: PodRequest, cfg: ExtenderConfig) -> Verdict:
    if pod.error:
        return Verdict(False, True, pod.error)
    ns.refresh()
    return verdict_of(ns, pod, cfg)


