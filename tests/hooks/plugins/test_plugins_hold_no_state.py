"""No built-in plugin holds mutable module-level state: a plugin is a set of pure functions, and
whatever a loop needs from one round to the next travels in the facts and the plan's records
(``hooks.usage.BurstState``, ``hooks.usage.SuppressDecision``), never in a module global that a
worker thread writes and another reads.

The check is structural, over every built-in plugin module as imported:

- its source has no ``global`` statement (nothing rebinds a module name after import);
- every module-level value is inert: a module, a function, a class, a type annotation helper,
  the ``hookimpl`` marker, or a deeply immutable value (numbers, strings, bytes, ``None``,
  enum members, and tuples, frozensets, ``MappingProxyType`` mappings and frozen dataclass
  instances made of such values);
- the default arguments of its functions, and the class-level attributes of its classes, are
  deeply immutable too (a mutable default is module state by another name);
- no function is wrapped in a cache (``functools.lru_cache`` keeps its entries in the module).

A planted module shows the check finds each of these.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import importlib.util
import inspect
import typing
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from types import BuiltinFunctionType, FunctionType, GenericAlias, MappingProxyType, ModuleType, UnionType

import pluggy
import pytest

from hooks.manager import builtin_plugin
from hooks.plugins import BUILTIN_PLUGINS

_SCALARS = (type(None), bool, int, float, complex, str, bytes, Fraction, range, enum.Enum)
_TYPING = (GenericAlias, UnionType, typing.TypeVar, type(typing.Any))


def _immutable(value: object, depth: int = 0) -> bool:
    """True for a value nothing can change in place (see module docstring)."""
    if depth > 20:
        return False
    if isinstance(value, _SCALARS) or value is Ellipsis:
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(_immutable(v, depth + 1) for v in value)
    if isinstance(value, MappingProxyType):
        return all(_immutable(k, depth + 1) and _immutable(v, depth + 1) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        params = getattr(type(value), "__dataclass_params__", None)
        return bool(params is not None and params.frozen) and all(
            _immutable(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)
        )
    return False


def _inert(value: object) -> bool:
    """A module-level value that holds no state of the module's own."""
    if isinstance(value, (ModuleType, FunctionType, BuiltinFunctionType, type, pluggy.HookimplMarker)):
        return True
    if isinstance(value, _TYPING) or type(value).__module__ in ("typing", "__future__"):
        return True
    return _immutable(value)


def _global_statements(module: ModuleType) -> list[str]:
    tree = ast.parse(inspect.getsource(module))
    return [f"line {n.lineno}: global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]


def _own(module: ModuleType, value: object) -> bool:
    return getattr(value, "__module__", None) == module.__name__


def _class_state(cls: type) -> Iterator[str]:
    for name, attr in vars(cls).items():
        if name.startswith("__") or callable(attr) or inspect.isdatadescriptor(attr):
            continue
        if isinstance(attr, (staticmethod, classmethod, property, functools.cached_property)):
            continue
        if not _immutable(attr):
            yield f"class attribute {cls.__name__}.{name} is a {type(attr).__name__}"


def state_of(module: ModuleType) -> list[str]:
    """What in ``module`` is mutable module-level state (empty: none)."""
    found = _global_statements(module)
    for name, value in vars(module).items():
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(value, functools._lru_cache_wrapper):
            found.append(f"{name} is wrapped in a cache")
            continue
        if not _inert(value):
            found.append(f"{name} is a {type(value).__name__}")
            continue
        if isinstance(value, FunctionType) and _own(module, value):
            defaults = (*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values())
            found += [f"{name} has a mutable default {d!r}" for d in defaults if not _immutable(d)]
        if isinstance(value, type) and _own(module, value):
            found += list(_class_state(value))
    return found


@pytest.mark.parametrize("name", BUILTIN_PLUGINS)
def test_no_builtin_plugin_holds_mutable_module_state(name: str) -> None:
    assert state_of(builtin_plugin(name)) == []


PLANTED = '''
import functools
from dataclasses import dataclass

LAST = None
SEEN = {}
ORDER = []


class Memo:
    cache = {}


@functools.lru_cache
def cached(x):
    return x


def remember(value, into=[]):
    global LAST
    LAST = value
    into.append(value)
    return into
'''


def test_the_check_finds_each_kind_of_state(tmp_path: Path) -> None:
    path = tmp_path / "planted_plugin.py"
    path.write_text(PLANTED)
    spec = importlib.util.spec_from_file_location("planted_plugin", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = state_of(module)
    assert any(f.endswith("global LAST") for f in found)
    assert "SEEN is a dict" in found and "ORDER is a list" in found
    assert "class attribute Memo.cache is a dict" in found
    assert "cached is wrapped in a cache" in found
    assert "remember has a mutable default []" in found
