"""The one YAML loader for documents from outside the process (``NoAliasLoader``).

PyYAML's ``SafeLoader`` builds plain data only, but it still follows anchors and aliases, so a
few hundred bytes can name one list millions of times over (the "billion laughs" shape) for any
code that walks the result. Documents we read from nodes, pods and users have no use for them:
``NoAliasLoader`` refuses both with a ``yaml.YAMLError``. Deep nesting still raises
``RecursionError`` in PyYAML's composer; callers turn it into their own format error.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["NoAliasLoader"]


class NoAliasLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses anchors and aliases."""

    # Any: PyYAML's composer is untyped (parent and index are nodes or None, the result a node).
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("YAML aliases are not allowed here")
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if getattr(event, "anchor", None):
            raise yaml.YAMLError("YAML anchors are not allowed here")
        return super().compose_node(parent, index)
