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
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PluginConfig", "ProxyConfig", "load_config"]


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


def load_config(path: str | None) -> ProxyConfig:
    """Read and validate a config file; ``None`` gives the defaults. Raises ValueError."""
    if not path:
        return ProxyConfig()
    text = Path(path).read_text()
    data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    return ProxyConfig.model_validate(data or {})
