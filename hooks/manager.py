"""Build the plugin manager: hookspecs, built-in plugins, and third-party plugins found through
the ``runtime_hook_proxy.plugins`` entry-point group.

Called by the proxy at start (``runtime_proxy.engine.pipeline``), by the hook server and by the
planner. Mistakes in a plugin surface here, at registration (``PluginValidationError``), not on
its first call.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable
from types import ModuleType

import pluggy

from hooks import spec
from hooks.plugins import BUILTIN_PLUGINS

ENTRY_POINT_GROUP = "runtime_hook_proxy.plugins"

__all__ = ["ENTRY_POINT_GROUP", "builtin_plugin", "installed_entry_points", "make_plugin_manager", "plugin_order"]


def builtin_plugin(name: str) -> ModuleType:
    """Import the built-in plugin module ``hooks.plugins.<name>``."""
    if name not in BUILTIN_PLUGINS:
        raise KeyError(f"no built-in plugin named {name!r}")
    return importlib.import_module(f"hooks.plugins.{name}")


def make_plugin_manager(
    *, builtins: Iterable[str] | None = None, entry_points: bool = True, extra: Iterable[object] = ()
) -> pluggy.PluginManager:
    """A fresh manager with our hookspecs.

    :param builtins: names of built-in plugins to register (all when ``None``).
    :param entry_points: also load third-party plugins from ``runtime_hook_proxy.plugins``.
    :param extra: more plugin objects (modules or instances) to register, in order.
    """
    pm = pluggy.PluginManager(spec.PROJECT)
    pm.add_hookspecs(spec)
    for name in BUILTIN_PLUGINS if builtins is None else builtins:
        pm.register(builtin_plugin(name), name=name)
    if entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for plugin in extra:
        pm.register(plugin)
    pm.check_pending()
    return pm


def installed_entry_points() -> list[str]:
    """The names of the plugins installed under ``runtime_hook_proxy.plugins``, sorted; read
    from the distributions' metadata, nothing imported."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})


def plugin_order(pm: pluggy.PluginManager, configured: Iterable[str] | None = None) -> list[str]:
    """Registered plugin names in calling order: the configured order first, then built-ins in
    their default order, then the rest sorted by name."""
    names = [n for n, _ in pm.list_name_plugin() if n is not None]
    order: list[str] = []
    for n in list(configured or ()) + [b for b in BUILTIN_PLUGINS if b in names] + sorted(names):
        if n in names and n not in order:
            order.append(n)
    return order
