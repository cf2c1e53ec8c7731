"""runtime-hook-proxy's plugin API: everything a plugin author needs, and nothing else.

A plugin is a module (or object) of functions marked with ``hookimpl`` and named after a hook in
``hooks.spec`` (``rhp_pre_create_container``, ``rhp_reconcile_container``...). Each takes the
frozen facts it asks for (``pod: PodFacts``, ``container: ContainerFacts``, ``node: NodeFacts``)
and returns a ``Plan`` or ``None``; it does no I/O. Publish it under the entry-point group
``runtime_hook_proxy.plugins``, with one name for the entry point, the module and the config
entry. The rules every hook shares are in ``hooks.spec``'s module docstring.

Everything else under ``hooks`` (the plugin manager, merging, the built-in plugins and their
helpers) belongs to the proxy and may change without notice.
"""

from hooks.facts import ContainerFacts, CPUTopology, NodeFacts, PodFacts, Resources
from hooks.plan import Plan
from hooks.spec import hookimpl

__all__ = [
    "CPUTopology",
    "ContainerFacts",
    "NodeFacts",
    "Plan",
    "PodFacts",
    "Resources",
    "hookimpl",
]
