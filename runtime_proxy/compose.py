"""The composition root: every ``runtime-proxy`` command (``runtime_proxy/commands/``) turns its
config into running parts here, and only here.

- ``with_flags``: the config file's settings overridden by the command line's
  ``--hook-server-dir``, ``--node-config``, ``--cgroup-root``, ``--cgroup-driver`` and
  ``--resctrl-root`` (those a command has).
- ``plugin_manager``: the built-in plugins (or ``builtins``), the ``runtime_hook_proxy.plugins``
  entry-point group (unless ``entry_points`` is false), the config's ``pluginModules``, extra
  plugin objects, then ``MODULE[:ATTR]`` specs (``hook-server --plugin-module``). A plugin that
  cannot be imported, registered or configured is a ``PluginLoadError`` naming it.
- ``pipeline``: the one hook runner over that manager, with the config's order, policies and
  timeouts, less the plugins whose hardware this node lacks (``wiring.plugin_settings``).
- ``build``: both, and the node config source, kubelet's cgroup root, the applier, the
  recorder of Events on pods (``wiring.events``) and the cluster's view of the node's pods
  (``wiring.pod_specs``), as one ``Parts``. The dry-run choice is made
  here, once (``--dry-run`` or the config's ``dryRun``): the applier the doors and the loops
  hand plans to is then ``RecordingApplier``, which records and logs them and changes nothing,
  instead of ``FileApplier``.
- ``loops``: the periodic loops (``wiring.loops``) over a command's backend and its ``Parts``.
- ``check_plugins``: ``plugin_manager`` and ``pipeline`` without logging, so that ``serve``
  refuses a bad plugin config before anything starts.

The lower-level builders (plugin settings, cgroup driver, node config source, applier, loops)
are in ``runtime_proxy.wiring``; this module is what the commands call.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import pluggy

from hooks.manager import make_plugin_manager
from rhp_kube.events import EventRecorder
from rhp_kube.liveness import all_of
from runtime_proxy import wiring
from runtime_proxy.config import ProxyConfig
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.host.apply import FileApplier, RecordingApplier
from runtime_proxy.loops.reconciler import ReconcileBackend
from runtime_proxy.state.kubelet_root import KubeletRoot
from runtime_proxy.state.nodeconfig import NodeConfig
from runtime_proxy.state.podspecs import ClusterPods, NoPodSpecs

if TYPE_CHECKING:
    from runtime_proxy.runtime.client import RuntimeClient

__all__ = [
    "Parts",
    "PluginLoadError",
    "build",
    "check_plugins",
    "load_plugin",
    "loops",
    "pipeline",
    "plugin_manager",
    "with_flags",
]

T = TypeVar("T")

# Command-line flag (argparse dest) -> the config key it overrides.
FLAG_KEYS = {
    "hook_server_dir": "hookServerDir",
    "node_config": "nodeConfigFile",
    "cgroup_root": "cgroupRoot",
    "cgroup_driver": "cgroupDriver",
    "resctrl_root": "resctrlRoot",
}


class PluginLoadError(ValueError):
    """A plugin that cannot be loaded or configured: a module that does not import, an object
    pluggy refuses, or a configured plugin name that is not installed."""


def with_flags(config: ProxyConfig, args: argparse.Namespace) -> ProxyConfig:
    """``config`` with each of ``FLAG_KEYS`` that ``args`` has and sets put in its key."""
    updates = {key: getattr(args, dest) for dest, key in FLAG_KEYS.items() if getattr(args, dest, None) is not None}
    return config.model_copy(update=updates)


def load_plugin(spec: str) -> tuple[str, object]:
    """``module`` or ``module:attr`` -> (registration name, plugin object). A class is
    instantiated (a plugin class with ``@hookimpl`` methods)."""
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    if not attr:
        return module_name, module
    obj: object = getattr(module, attr)
    if isinstance(obj, type):
        obj = obj()
    return attr, obj


def _load(kind: str, spec: str, load: Callable[[str], T]) -> T:
    try:
        return load(spec)
    except Exception as exc:
        raise PluginLoadError(f"{kind} {spec!r} cannot be loaded: {type(exc).__name__}: {exc}") from exc


def plugin_manager(
    config: ProxyConfig,
    *,
    builtins: tuple[str, ...] | None = None,
    entry_points: bool = True,
    extra: Iterable[object] = (),
    specs: Iterable[str] = (),
) -> pluggy.PluginManager:
    """Every plugin a command registers (see the module doc). Raises ``PluginLoadError``."""
    modules = [_load("pluginModules entry", name, importlib.import_module) for name in config.pluginModules]
    try:
        pm = make_plugin_manager(builtins=builtins, entry_points=entry_points, extra=[*modules, *extra])
    except Exception as exc:
        raise PluginLoadError(f"plugins cannot be registered: {type(exc).__name__}: {exc}") from exc
    for spec in specs:
        name, plugin = _load("--plugin-module", spec, load_plugin)
        try:
            pm.register(plugin, name=name)
            pm.check_pending()
        except Exception as exc:
            raise PluginLoadError(f"--plugin-module {spec!r}: {type(exc).__name__}: {exc}") from exc
    return pm


def pipeline(config: ProxyConfig, pm: pluggy.PluginManager, *, entry_points: bool = True,
             announce: bool = True) -> Pipeline:
    """The hook runner of the plugins ``config`` runs (``wiring.plugin_settings``; ``announce``
    false logs nothing). Raises ``PluginLoadError`` for a configured plugin that is not installed."""
    try:
        settings = wiring.plugin_settings(config, pm, entry_points=entry_points, announce=announce)
    except ValueError as exc:
        raise PluginLoadError(str(exc)) from exc
    return Pipeline(plugin_steps(pm, settings))


def check_plugins(config: ProxyConfig, *, entry_points: bool = True) -> None:
    """Load the plugins ``config`` names as ``build`` will, logging nothing (the start that
    follows logs what it leaves out). Raises ``PluginLoadError``."""
    pipeline(config, plugin_manager(config, entry_points=entry_points), entry_points=entry_points, announce=False)


@dataclass
class Parts:
    """What ``build`` makes for one command; nothing is started."""

    config: ProxyConfig
    pm: pluggy.PluginManager
    pipeline: Pipeline
    node_source: NodeConfig  # the source of NodeFacts, and the watch to start and stop
    applier: FileApplier | RecordingApplier  # what the doors and the loops hand plans to
    kubelet_root: KubeletRoot
    dry_run: bool  # log plans, change and apply nothing
    events: EventRecorder  # Events on pods for hook failures and refusals (the doors' Lifecycle)
    # The cluster's view of this node's pods (their batch resources), for the doors and the
    # reconciler; started and stopped by the command beside node_source.
    pod_specs: ClusterPods | NoPodSpecs

    def liveness(self) -> tuple[bool, str]:
        """A node command's ``/healthz``: the cluster watches it started (the node config's and
        the pod specs', ``rhp_kube.watch``) have heard from the API server within their bound;
        always alive without ``fromCluster``."""
        return all_of(self.node_source.liveness, self.pod_specs.liveness)()


def build(
    config: ProxyConfig,
    *,
    dry_run: bool = False,
    builtins: tuple[str, ...] | None = None,
    entry_points: bool = True,
    extra: Iterable[object] = (),
    specs: Iterable[str] = (),
) -> Parts:
    """The parts every command shares, for ``config``. ``dry_run`` (``--dry-run``) or the
    config's ``dryRun`` makes a dry run. Raises ``PluginLoadError``."""
    pm = plugin_manager(config, builtins=builtins, entry_points=entry_points, extra=extra, specs=specs)
    runner = pipeline(config, pm, entry_points=entry_points)
    dry_run = dry_run or config.dryRun
    node_source, _ = wiring.node_source(config)
    files = wiring.applier(config)
    chosen = RecordingApplier(cgroups=files.cgroups, resctrl=files.resctrl) if dry_run else files
    return Parts(
        config=config,
        pm=pm,
        pipeline=runner,
        node_source=node_source,
        applier=chosen,
        kubelet_root=wiring.kubelet_root(config),
        dry_run=dry_run,
        events=wiring.events(config),
        pod_specs=wiring.pod_specs(config),
    )


def loops(parts: Parts, backend: ReconcileBackend, *, ready: asyncio.Event,
          runtime: RuntimeClient | None = None) -> wiring.Loops:
    """The periodic loops of a command (``wiring.loops``) over ``backend``, started once ``ready``
    is set; ``runtime`` is the CRI client the usage loop's ``evictBy: runtime`` stops pods with."""
    return wiring.loops(parts.config, backend, pm=parts.pm, pipeline=parts.pipeline, applier=parts.applier,
                        node_source=parts.node_source, ready=ready, runtime=runtime, events=parts.events,
                        pod_specs=parts.pod_specs)
