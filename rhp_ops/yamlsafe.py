"""The one reader of YAML and JSON documents from outside the process: configuration files,
node config documents, kubelet's configuration, ``simulate``'s documents, manifests.

``load_yaml`` and ``load_document`` bound the text before parsing (``max_bytes``, the caller's
limit), refuse YAML anchors and aliases (``NoAliasLoader``), bound the nesting (``max_depth``)
and turn every failure into one ``DocumentError`` (a ``ValueError``) whose message is one line:
why, and for YAML where (line and column). Nothing else escapes them, whatever the input.

PyYAML's ``SafeLoader`` builds plain data only, but it still follows anchors and aliases, so a
few hundred bytes can name one list millions of times over (the "billion laughs" shape) for any
code that walks the result. Documents we read from nodes, pods and users have no use for them.

Who calls this: ``runtime_proxy.config`` (the proxy's config file), ``runtime_proxy.state.nodedoc``
(the node config document), ``runtime_proxy.commands.kubelet_switch`` and
``runtime_proxy.report.sources`` (kubelet's configuration), ``scheduler_ext.cli`` (``simulate``'s
document) and ``scheduler_ext.extconfig`` (the extender's ``--config``).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

__all__ = ["MAX_DEPTH", "DocumentError", "NoAliasLoader", "load_document", "load_yaml"]

# Deeper than any document we read has a reason to be; PyYAML's composer and json recurse per level.
MAX_DEPTH = 100


class DocumentError(ValueError):
    """A document refused: larger than its bound, not YAML/JSON, an anchor or alias, too deep."""


class NoAliasLoader(yaml.SafeLoader):
    """A safe YAML loader that refuses anchors and aliases and nesting deeper than ``max_depth``."""

    max_depth = MAX_DEPTH

    def __init__(self, stream: Any) -> None:  # Any: what yaml.SafeLoader takes (str, bytes, a file)
        super().__init__(stream)
        self._depth = 0

    # Any: PyYAML's composer is untyped (parent and index are nodes or None, the result a node).
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("YAML aliases are not allowed here")
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if getattr(event, "anchor", None):
            raise yaml.YAMLError("YAML anchors are not allowed here")
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise yaml.YAMLError(f"nested more than {self.max_depth} deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_size(text: str | bytes, max_bytes: int) -> None:
    """``DocumentError`` when ``text`` is over ``max_bytes`` bytes (a ``str`` as UTF-8; its bytes
    are counted only when its length could be over: a character is at most 4 bytes)."""
    size = len(text)
    if isinstance(text, str) and size * 4 > max_bytes:
        size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise DocumentError(f"larger than {max_bytes} bytes")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    return f"not valid YAML{where}: {str(problem)[:300]}"


def load_yaml(text: str | bytes, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:  # Any: YAML data
    """The YAML (or JSON, which YAML reads) in ``text``: plain data, ``None`` for an empty
    document. ``DocumentError`` when ``text`` is over ``max_bytes`` bytes, not YAML, holds an
    anchor or alias or is nested deeper than ``max_depth``."""
    _check_size(text, max_bytes)
    loader = NoAliasLoader(text)
    loader.max_depth = max_depth
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise DocumentError(_yaml_problem(exc)) from None
    except RecursionError:
        raise DocumentError("nested too deeply") from None
    finally:
        loader.dispose()


def load_document(text: str | bytes, *, max_bytes: int, json_first: bool = True,
                  max_depth: int = MAX_DEPTH) -> Any:  # Any: JSON or YAML data
    """A JSON or YAML document: with ``json_first``, JSON when it parses as JSON, else YAML (a
    text that is neither gets the YAML reason); without, YAML only. ``DocumentError`` as
    ``load_yaml``; JSON nested too deeply for the decoder is "nested too deeply"."""
    _check_size(text, max_bytes)
    if json_first:
        try:
            return json.loads(text)
        except RecursionError:
            raise DocumentError("nested too deeply") from None
        except ValueError:
            pass
    return load_yaml(text, max_bytes=max_bytes, max_depth=max_depth)
