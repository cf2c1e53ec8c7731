"""runtime-hook-proxy's plugin contract.

Write a plugin as a module of functions marked with ``hookimpl``, named after the hooks in
``hooks.spec``, that take facts (``PodFacts``, ``ContainerFacts``, ``NodeFacts``) and return a
``Plan`` or ``None``. Publish it under the entry-point group ``runtime_hook_proxy.plugins``.
"""

from hooks.facts import ContainerFacts, CPUTopology, NodeFacts, PodFacts, Resources
from hooks.plan import CgroupWrite, Plan
from hooks.spec import hookimpl, hookspec

__all__ = [
    "CPUTopology",
    "CgroupWrite",
    "ContainerFacts",
    "NodeFacts",
    "Plan",
    "PodFacts",
    "Resources",
    "hookimpl",
    "hookspec",
]
