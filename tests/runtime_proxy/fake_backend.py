"""The store and runtime client as the loops see them (``node``, ``pods``, ``containers``,
``update_container_resources``), in memory: updates are recorded and change the listed
container's resources."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from runtime_proxy.state.nodeconfig import NodeConfig


@dataclass
class FakeBackend:
    """The store and runtime client, as the reconciler sees them."""

    node_facts: NodeFacts = field(default_factory=NodeFacts)
    pod_list: list[PodFacts] = field(default_factory=list)
    container_list: list[tuple[PodFacts, ContainerFacts]] = field(default_factory=list)
    updates: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    node_config: NodeConfig | None = None

    def node(self) -> NodeFacts:
        return self.node_config.current() if self.node_config is not None else self.node_facts

    def pods(self) -> list[PodFacts]:
        return list(self.pod_list)

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return list(self.container_list)

    async def update_container_resources(self, container_id: str, changes: dict[str, Any]) -> None:
        self.updates.append((container_id, changes))
        for i, (p, c) in enumerate(self.container_list):
            if c.id == container_id:
                self.container_list[i] = (p, c.replace(resources=c.resources.with_changes(changes)))
