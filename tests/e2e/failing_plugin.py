"""A plugin for ``test_e2e_events.py``: it fails at ``PreCreateContainer`` for pods labelled
``rhp-e2e/fail-hook: "true"`` (and does nothing for the others), loaded by the proxy through
``pluginModules`` as ``tests.e2e.failing_plugin``."""

from __future__ import annotations

from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from hooks.plan import Plan
from hooks.spec import hookimpl

LABEL = "rhp-e2e/fail-hook"


@hookimpl
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> Plan | None:
    if pod.labels.get(LABEL) == "true":
        raise RuntimeError(f"e2e plugin fails for {pod.namespace}/{pod.name} as asked")
    return None
