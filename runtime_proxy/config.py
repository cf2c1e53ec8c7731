"""The proxy's plugin config file (YAML or JSON), validated with pydantic.

Read by ``runtime_proxy.server`` at start. Example (``packaging/proxy-config.yaml``)::

    plugins:              # enabled plugins, in calling order; absent = every plugin
      - name: cpuset
        policy: Ignore    # Fail | Ignore (default Ignore)
        timeout: 1.0      # seconds (default: defaultTimeout)
      - name: my_plugin
        policy: Fail
    defaultPolicy: Ignore
    defaultTimeout: 2.0
    hookServerDir: /etc/runtime/hookserver.d
    hookServerTimeout: 2.0
    dryRun: false

With no config file every registered plugin (built-ins, then entry-point plugins by name) is on
with the defaults; each acts only where a pod's labels or annotations or the node config ask.
"""

from __future__ import annotations

import json
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["MAX_CONFIG_BYTES", "ConfigError", "PluginConfig", "ProxyConfig", "load_config"]

MAX_CONFIG_BYTES = 1 << 20


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and says why, in one or a
    few lines meant for a person (no traceback, no pydantic URLs)."""


class PluginConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    policy: Literal["Fail", "Ignore"] | None = None
    timeout: float | None = Field(default=None, gt=0, le=300)
    enabled: bool = True


class ProxyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    plugins: list[PluginConfig] | None = None
    # Importable modules registered as plugins (besides built-ins and entry points).
    pluginModules: list[str] = Field(default_factory=list)
    defaultPolicy: Literal["Fail", "Ignore"] = "Ignore"
    defaultTimeout: float = Field(default=2.0, gt=0, le=300)
    hookServerDir: str = "/etc/runtime/hookserver.d"
    hookServerTimeout: float = Field(default=2.0, gt=0, le=300)
    dryRun: bool = False
    cgroupRoot: str = "/sys/fs/cgroup"
    cgroupDriver: Literal["cgroupfs", "systemd"] = "cgroupfs"
    resctrlRoot: str = "/sys/fs/resctrl"
    nodeConfigFile: str | None = None
    nodeName: str | None = None
    fromCluster: bool = False
    reconcilePeriodSeconds: float = Field(default=10.0, gt=0)

    def plugin_settings(self, registered: list[str]) -> list[tuple[str, Literal["Fail", "Ignore"], float]]:
        """``(name, policy, timeout)`` for each enabled plugin, in calling order."""
        if self.plugins is None:
            return [(name, self.defaultPolicy, self.defaultTimeout) for name in registered]
        out: list[tuple[str, Literal["Fail", "Ignore"], float]] = []
        for p in self.plugins:
            if not p.enabled:
                continue
            if p.name not in registered:
                raise ValueError(f"plugin {p.name!r} is configured but not installed (have: {registered})")
            out.append((p.name, p.policy or self.defaultPolicy, p.timeout or self.defaultTimeout))
        return out


def _validation_message(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(part) for part in err["loc"]) or "(top level)"
        lines.append(f"{where}: {err['msg']}")
    return "; ".join(lines)


def load_config(path: str | None) -> ProxyConfig:
    """Read and validate a config file (JSON when the name ends in ``.json``, else YAML);
    ``None`` gives the defaults. Raises ``ConfigError`` (a ValueError) for an unreadable,
    oversized (> ``MAX_CONFIG_BYTES``), unparsable or invalid file, and nothing else."""
    if not path:
        return ProxyConfig()
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from exc
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
        raise ConfigError(f"{path}: {_validation_message(exc)}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{path}: nested too deeply") from exc
