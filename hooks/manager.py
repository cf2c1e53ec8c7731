"""Build the plugin manager: hookspecs, built-in plugins, and third-party plugins found through
the ``runtime_hook_proxy.plugins`` entry-point group.

Every command that runs plugins builds its manager with ``make_plugin_manager``; the hook runner
(``runtime_proxy.engine.pipeline``) then calls each plugin's hook function itself, once, in the
configured plugin order. Mistakes in a plugin surface here, at registration
(``PluginValidationError``), not on its first call: pluggy's own checks (an argument the hookspec
does not have, a hook that does not exist) and ours, ``REFUSED_OPTIONS``: pluggy's ordering and
wrapping options, which that runner does not honour, so a plugin that asks for them is refused
instead of being run in the wrong order or wrongly.
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

# pluggy hookimpl options the hook runner does not honour: it calls one plugin at a time in the
# config's order (no tryfirst/trylast) and calls the function once for its result (a wrapper's
# generator would be returned instead of a plan).
REFUSED_OPTIONS = ("tryfirst", "trylast", "wrapper", "hookwrapper")

__all__ = [
    "ENTRY_POINT_GROUP",
    "REFUSED_OPTIONS",
    "PluginManager",
    "builtin_plugin",
    "installed_entry_points",
    "make_plugin_manager",
    "plugin_order",
]


class PluginManager(pluggy.PluginManager):
    """pluggy's manager for our hookspecs that refuses, at registration, a hook implementation
    marked with one of ``REFUSED_OPTIONS``. Every way in refuses alike: ``register`` itself, so
    also entry points (``load_setuptools_entrypoints``) and plugins registered by hand."""

    def __init__(self) -> None:
        super().__init__(spec.PROJECT)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin`` as pluggy does, after checking every hook implementation's options;
        ``PluginValidationError`` naming the plugin and the hook leaves the manager unchanged."""
        if plugin is not None:
            plugin_name = name or self.get_canonical_name(plugin)
            for attr in dir(plugin):
                opts = self.parse_hookimpl_opts(plugin, attr)
                if opts is None:
                    continue
                refused = [option for option in REFUSED_OPTIONS if opts.get(option)]
                if refused:
                    hook = opts.get("specname") or attr
                    marked = ", ".join(f"{option}=True" for option in refused)
                    raise pluggy.PluginValidationError(
                        plugin,
                        f"plugin {plugin_name!r}: hook {hook!r} is marked {marked}, which runtime-hook-proxy "
                        "does not support: each plugin's hook runs once, on its own, in the order of the "
                        "config's plugins list; remove the option (and set the order in the config)",
                    )
        return super().register(plugin, name)


def builtin_plugin(name: str) -> ModuleType:
    """Import the built-in plugin module ``hooks.plugins.<name>``."""
    if name not in BUILTIN_PLUGINS:
        raise KeyError(f"no built-in plugin named {name!r}")
    return importlib.import_module(f"hooks.plugins.{name}")


def make_plugin_manager(
    *, builtins: Iterable[str] | None = None, entry_points: bool = True, extra: Iterable[object] = ()
) -> PluginManager:
    """A fresh manager with our hookspecs.

    :param builtins: names of built-in plugins to register (all when ``None``).
    :param entry_points: also load third-party plugins from ``runtime_hook_proxy.plugins``.
    :param extra: more plugin objects (modules or instances) to register, in order.
    """
    pm = PluginManager()
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
