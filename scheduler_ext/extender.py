"""The kube-scheduler extender's decisions and verbs, by job (this module only gathers them):

- ``scheduler_ext.decide``: the scoring configuration (``ExtenderConfig``), what a pod needs on
  a node (``needs``), its verdict and score (``evaluate``, memoised per pod kind and node) and
  the exact placement a bind writes (``plan``);
- ``scheduler_ext.views``: the admission view of a cached node and the views its reservations
  give one pod, and the reservation a bind allocates from;
- ``scheduler_ext.verbs``: filter, prioritize and preempt over the candidate nodes;
- ``scheduler_ext.binder``: the bind verb, the one place that writes (``Binder``).

Who imports this: tests and tools that want the extender's public names in one place;
``scheduler_ext.server`` and ``scheduler_ext.cli`` import the modules above directly.
"""

from __future__ import annotations

from scheduler_ext.binder import BindAPI, Binder, Ledger
from scheduler_ext.decide import (
    DEFAULT_CONFIG,
    STRATEGIES,
    ExtenderConfig,
    Needs,
    Placement,
    Verdict,
    evaluate,
    needs,
    plan,
)
from scheduler_ext.verbs import FilterResult, filter_nodes, preempt_nodes, prioritize_nodes

__all__ = [
    "DEFAULT_CONFIG",
    "STRATEGIES",
    "BindAPI",
    "Binder",
    "ExtenderConfig",
    "FilterResult",
    "Ledger",
    "Needs",
    "Placement",
    "Verdict",
    "evaluate",
    "filter_nodes",
    "needs",
    "plan",
    "preempt_nodes",
    "prioritize_nodes",
]
