"""The proxy's config file (YAML or JSON), validated with pydantic.

Read by ``runtime-proxy serve``, ``hook-server``, ``nri``, ``plan --config`` and ``doctor``
(``runtime_proxy/commands/``), which build their parts from it with ``runtime_proxy.compose``. Example:
``packaging/proxy-config.yaml``. Every key, its type, default and meaning: ``docs/config.md``,
whose table is generated from this model (``python -m runtime_proxy.config``) and checked by
``tests/runtime_proxy/test_config.py``.

The file is bounded (``MAX_CONFIG_BYTES``) before it is parsed; pydantic then checks its shape.
An unknown key is an error naming its path (``plugins.0.polcy``) and, when one is close, the key
that was meant. With no config file every registered plugin (built-ins, then entry-point plugins
by name) is on with the defaults; each acts only where a pod's labels or annotations or the node
config ask.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hooks.facts import parse_kubelet_cgroup_root
from rhp_ops.build import extra_hint
from rhp_ops.files import FileRefused, read_regular_file
from rhp_ops.yamlsafe import DocumentError, load_yaml
from runtime_proxy.report.config import ReportConfig

__all__ = [
    "MAX_CONFIG_BYTES",
    "ConfigError",
    "PluginConfig",
    "ProxyConfig",
    "UsageLoopConfig",
    "check_usable",
    "load_config",
    "reference_table",
    "validation_message",
]

MAX_CONFIG_BYTES = 1 << 20

# The sockets ``serve`` listens on (Koordinator's runtime-proxy endpoint) and forwards to
# (containerd's CRI socket) unless told otherwise; ``nri --backend`` and ``doctor`` share them.
DEFAULT_LISTEN = "/var/run/koord-runtimeproxy/runtimeproxy.sock"
DEFAULT_BACKEND = "/var/run/containerd/containerd.sock"

# A hostile document can hold many bad keys and long ones: the message names the first few,
# each path cut to a readable length.
MAX_REPORTED_ERRORS = 5
MAX_PATH_CHARS = 200
Policy = Literal["Fail", "Ignore"]


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and says why, in one or a
    few lines meant for a person (no traceback, no pydantic URLs)."""


class PluginConfig(BaseModel):
    """One entry of ``plugins``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="The plugin's name: a built-in (`cpuset`, `numa`, ...), an "
                      "entry-point plugin's name or a `pluginModules` module's name. Required.")
    policy: Policy | None = Field(default=None, description="`Fail` (a fault fails the CRI call) or `Ignore` "
                                  "(a fault is logged and counted, the call goes on); default `defaultPolicy`.")
    timeout: float | None = Field(default=None, gt=0, le=300, description="Seconds one call of this plugin "
                                  "may take, in (0, 300]; default `defaultTimeout`.")
    enabled: bool = Field(default=True, description="`false` keeps the entry in the file but does not run "
                          "the plugin.")


class UsageLoopConfig(BaseModel):
    """``usageLoop``: the usage-driven loop (``runtime_proxy.loops.qos``)."""

    model_config = ConfigDict(extra="forbid")

    enable: bool | None = Field(default=None, description="Run the usage loop (sample node, pod and BE usage "
                                "every `intervalSeconds` and run the `ReconcileUsage` plugins: CPU suppress, "
                                "evictions): `true` always, `false` never; unset: whenever an enabled plugin "
                                "implements `ReconcileUsage` (`cpu_suppress`, `memory_qos`, `memory_evict`, "
                                "`cpu_evict`). "
                                "The start logs whether it runs and why.")
    intervalSeconds: float = Field(default=1.0, gt=0, le=60, description="Seconds between usage-loop rounds, "
                                   "in (0, 60] (Koordinator: 1).")
    procRoot: str = Field(default="/proc", description="Where the usage loop reads `stat` and `meminfo`.")
    evictBy: Literal["api", "delete", "runtime"] = Field(default="api", description="How the eviction plugins' "
                                               "victims go: `api`, a Kubernetes policy/v1 Eviction with the pod's UID "
                                               "as precondition (PodDisruptionBudgets honoured; in-cluster or "
                                               "kubeconfig credentials); `delete`, the pod deleted with its UID as "
                                               "precondition, as kubelet's node-pressure eviction (no "
                                               "PodDisruptionBudget; the API server can hold it to the node: the "
                                               "chart's default); `runtime`, every running container of the "
                                               "pod stopped through the CRI backend, for nodes without cluster "
                                               "access. See `docs/config.md`, Eviction.")


class AllocationTrustConfig(BaseModel):
    """Which resource-status cpusets the node honours (``hooks.signatures``, ``docs/signing.md``)."""

    model_config = ConfigDict(extra="forbid")

    publicKeyFiles: list[str] = Field(default_factory=list, max_length=16, description="Public-key lists "
                                      "(`ed25519 BASE64` lines, as scheduler-ext publishes them in its ConfigMap) "
                                      "whose keys verify pods' allocation signatures; re-read when they change. "
                                      "With keys, a cpuset is honoured only when its signature verifies for the "
                                      "pod on this node and it has no more CPUs than the CPU request signed "
                                      "with it. A missing file counts as no keys; an unreadable or malformed "
                                      "one keeps the keys last read.")
    acceptUnsigned: bool | None = Field(default=None, description="Honour cpusets without a signature (the "
                                        "writer of resource-status is trusted, as beside koord-scheduler; a "
                                        "signature a held key refutes is still refused). Unset: true without "
                                        "`publicKeyFiles`, false with them.")


class ProxyConfig(BaseModel):
    """The whole config file."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    plugins: list[PluginConfig] | None = Field(default=None, description="The plugins to run, in calling "
                                               "order. Absent: every installed plugin (built-ins in their "
                                               "order, then entry-point plugins by name) with the defaults. "
                                               "A plugin named here that is not installed stops the start "
                                               "(exit code 2).")
    pluginModules: list[str] = Field(default_factory=list, description="Importable Python modules to "
                                     "register as plugins besides the built-ins and entry points; each "
                                     "is named after its module. One that does not import stops the "
                                     "start (exit code 2).")
    defaultPolicy: Policy = Field(default="Ignore", description="Failure policy of plugins that set none.")
    defaultTimeout: float = Field(default=2.0, gt=0, le=300, description="Seconds per plugin call for "
                                  "plugins that set none, in (0, 300].")
    hookServerDir: str = Field(default="/etc/runtime/hookserver.d", description="Directory of hook-server "
                               "registrations (`*.json`, Koordinator's format, see "
                               "`runtime_proxy/hookclient/`); missing means none until it appears.")
    hookServerTimeout: float = Field(default=2.0, gt=0, le=300, description="Seconds per hook-server call "
                                     "when a registration sets no `timeout-seconds`.")
    dryRun: bool = Field(default=False, description="Compute and log plans, change nothing "
                         "(as `serve --dry-run`).")
    cgroupRoot: str = Field(default="/sys/fs/cgroup", description="The cgroup filesystem root.")
    cgroupDriver: Literal["cgroupfs", "systemd"] | None = Field(default=None, description="kubelet's cgroup "
                                                                 "driver (`cgroupDriver` in its config). Unset: "
                                                                 "detected at start from kubelet's cgroups "
                                                                 "(`kubepods.slice`: systemd, `kubepods`: "
                                                                 "cgroupfs; neither yet: cgroupfs, with a "
                                                                 "warning) and logged.")
    kubeletCgroupRoot: str = Field(default="", description="kubelet's cgroup root (`cgroupRoot` in its "
                                   "config, `--cgroup-root`), in kubelet's form (`/custom`, for either "
                                   "driver): the QoS-level cgroups (`kubepods`, `kubepods/besteffort`...) "
                                   "are below it. Empty: learned from the cgroup parents kubelet sends "
                                   "(the root most pods show; `/` until a pod shows one). A set value "
                                   "wins; pods whose parent disagrees are logged. See `docs/config.md`, "
                                   "kubelet's cgroup root.")
    resctrlRoot: str = Field(default="/sys/fs/resctrl", description="The resctrl filesystem root.")
    nodeConfigFile: str | None = Field(default=None, description="A local node config file (NodeSLO spec, "
                                       "node labels and annotations; example "
                                       "`packaging/examples/nodeslo.yaml`), re-read when it changes. When the "
                                       "command starts it must be a readable regular file (or a symlink to "
                                       "one) of at most 1 MiB (exit code 2 otherwise); if it is removed or "
                                       "becomes unreadable later the last config stays.")
    nodeName: str | None = Field(default=None, description="This node's name, for `fromCluster`; default "
                                 "the `NODE_NAME` environment variable, else the host name.")
    fromCluster: bool = Field(default=False, description="Watch this node's Node, NodeSLO and "
                              "NodeResourceTopology, and the pods on it (their batch resources: \"BE pods' "
                              "batch resources\" below), in the cluster (in-cluster or kubeconfig credentials; "
                              "RBAC: `packaging/kustomize/base/node/rbac.yaml`); the cluster's values win "
                              "over `nodeConfigFile`'s. Needs the `kubernetes` client, the `[cluster]` extra (in "
                              "the Debian package and the node image; a wheel install: README.md, \"Install the "
                              "wheel\").")
    reconcilePeriodSeconds: float = Field(default=10.0, gt=0, description="Seconds between reconciler "
                                          "rounds (every pod's cgroup and resctrl state made to match "
                                          "its plan again).")
    usageLoop: UsageLoopConfig = Field(default_factory=UsageLoopConfig, description="The usage loop "
                                       "(`runtime_proxy/loops/qos.py`): sampling and the `ReconcileUsage` "
                                       "decisions.")
    allocationTrust: AllocationTrustConfig = Field(default_factory=AllocationTrustConfig, description="Which "
                                                   "resource-status cpusets the node honours: signed by "
                                                   "scheduler-ext (public keys), or also unsigned ones.")
    report: ReportConfig = Field(default_factory=ReportConfig, description="The node's reports to the cluster "
                                 "(`runtime_proxy/report/`): NodeResourceTopology, Device and NodeMetric status, "
                                 "off unless `report.enable`.")

    @field_validator("kubeletCgroupRoot")
    @classmethod
    def _kubelet_root(cls, value: str) -> str:
        """Normalised (``/custom/`` is ``/custom``); refused when kubelet could not use it."""
        return parse_kubelet_cgroup_root(value) if value else ""

    def plugin_settings(self, registered: list[str]) -> list[tuple[str, Policy, float]]:
        """``(name, policy, timeout)`` for each enabled plugin, in calling order."""
        if self.plugins is None:
            return [(name, self.defaultPolicy, self.defaultTimeout) for name in registered]
        out: list[tuple[str, Policy, float]] = []
        for p in self.plugins:
            if not p.enabled:
                continue
            if p.name not in registered:
                name = p.name if len(p.name) <= 100 else p.name[:97] + "..."
                raise ValueError(f"plugin {name!r} is configured but not installed (have: {registered})")
            out.append((p.name, p.policy or self.defaultPolicy, p.timeout or self.defaultTimeout))
        return out


def _fields_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the (sub)model that holds ``loc``'s last key, for suggestions."""
    current: object = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        current = _inner_model(current.model_fields[part].annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [info.alias or name for name, info in current.model_fields.items()]
    return []


def _inner_model(annotation: object) -> object:
    """The pydantic model inside ``list[M] | None`` and the like (else ``annotation``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
    return annotation


# Pydantic error types said in the words of a JSON or YAML document.
_PLAIN = {
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "missing": "required",
}


def validation_message(exc: ValidationError, model: type[BaseModel]) -> str:
    """One line per problem, ``path: what`` (``plugins.0.polcy: unknown key; did you mean
    policy?``), joined by ``; ``; at most ``MAX_REPORTED_ERRORS`` problems, paths cut at
    ``MAX_PATH_CHARS``; no pydantic URLs or input echoes."""
    lines = []
    errors = exc.errors(include_url=False)
    for err in errors[:MAX_REPORTED_ERRORS]:
        loc = tuple(err["loc"])
        where = ".".join(str(part) for part in loc) or "(top level)"
        if len(where) > MAX_PATH_CHARS:
            where = where[: MAX_PATH_CHARS - 3] + "..."
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
            fields = _fields_at(model, loc)
            lowered = {name.lower(): name for name in fields}
            key = str(loc[-1])
            close = [lowered[key.lower()]] if key.lower() in lowered else []
            close = close or difflib.get_close_matches(key, fields, n=1, cutoff=0.6)
            if close:
                msg += f"; did you mean {close[0]}?"
        else:
            msg = _PLAIN.get(err["type"], err["msg"])
        lines.append(f"{where}: {msg}")
    if len(errors) > MAX_REPORTED_ERRORS:
        lines.append(f"and {len(errors) - MAX_REPORTED_ERRORS} more")
    return "; ".join(lines)


def load_config(path: str | None) -> ProxyConfig:
    """Read and validate a config file (JSON when the name ends in ``.json``, else YAML);
    ``None`` gives the defaults. The file is read by the one reader of configured files
    (``rhp_ops.files.read_regular_file``: a regular file or a symlink to one, never blocking).
    Raises ``ConfigError`` (a ValueError) for a missing, unreadable, not regular (a FIFO, a
    socket, a device, a directory), oversized (> ``MAX_CONFIG_BYTES``), unparsable or invalid
    file, and nothing else."""
    if not path:
        return ProxyConfig()
    try:
        raw = read_regular_file(path, limit=MAX_CONFIG_BYTES)
    except FileRefused as exc:
        raise ConfigError(f"{path}: {exc.message}") from None
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if path.endswith(".json") else load_yaml(text, max_bytes=MAX_CONFIG_BYTES)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except DocumentError as exc:  # the one YAML reader: bounded, no anchors or aliases
        raise ConfigError(f"{path}: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: nested too deeply") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be a mapping of settings, not {type(data).__name__}")
    try:
        return ProxyConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {validation_message(exc, ProxyConfig)}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: nested too deeply") from exc


def check_usable(cfg: ProxyConfig) -> None:
    """What a valid config still needs from this machine before a command starts: the
    ``nodeConfigFile`` it names can be read (``runtime_proxy.state.nodeconfig.read_document_text``:
    it exists, is a regular file or a symlink to one, within the size bound, UTF-8), and
    ``fromCluster`` and ``report.enable`` have the ``kubernetes`` client installed. Raises ``ConfigError`` naming the
    key. Called by ``serve``, ``hook-server``, ``nri`` and ``doctor`` (``runtime_proxy/commands/``)
    before they build anything."""
    if cfg.nodeConfigFile is not None:
        from runtime_proxy.state.nodeconfig import read_document_text

        try:
            read_document_text(Path(cfg.nodeConfigFile))
        except FileRefused as exc:
            if exc.reason == "missing":
                raise ConfigError(f"nodeConfigFile {cfg.nodeConfigFile}: no such file (create it, e.g. from "
                                  "packaging/examples/nodeslo.yaml, or remove the key)") from None
            raise ConfigError(f"nodeConfigFile {cfg.nodeConfigFile}: {exc.message}") from None
    if cfg.fromCluster and importlib.util.find_spec("kubernetes") is None:
        raise ConfigError(f"fromCluster needs the kubernetes client: {extra_hint('cluster')}")
    if cfg.report.enable and importlib.util.find_spec("kubernetes") is None:
        raise ConfigError(f"report.enable needs the kubernetes client: {extra_hint('cluster')}")


# ---- the reference table of docs/config.md ----------------------------------------------------


def _type_name(annotation: object) -> str:
    """``list[PluginConfig] | None`` -> ``list of objects, or null``; ``Literal['a','b']`` -> ``"a" or "b"``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in args)
    if origin in (Union, UnionType):
        parts = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (", or null" if type(None) in args else "")
    if origin is list:
        return f"list of {_type_name(args[0])}s" if args else "list"
    if origin is dict:
        return "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    names: dict[object, str] = {str: "string", float: "number", int: "integer", bool: "boolean"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _rows(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, str, str]]:
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        if info.default_factory is not None:
            value = info.default_factory()  # type: ignore[call-arg]
            default = json.dumps(value.model_dump() if isinstance(value, BaseModel) else value)
        elif info.is_required():
            default = "required"
        else:
            default = json.dumps(info.default)
        yield key, _type_name(info.annotation), default, info.description or ""
        inner = _inner_model(info.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            yield from _rows(inner, f"{key}." if info.annotation is inner else f"{key}[].")


def reference_table() -> str:
    """The Markdown table of every config key (``docs/config.md`` holds it verbatim)."""
    lines = ["| Key | Type | Default | Meaning |", "|---|---|---|---|"]
    for key, type_name, default, description in _rows(ProxyConfig, ""):
        lines.append(f"| `{key}` | {type_name} | `{default}` | {description} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(reference_table())
