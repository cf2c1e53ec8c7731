"""The composition root (``runtime_proxy.compose``): every command builds its parts with
``compose.build`` (the plan command with ``compose.plugin_manager``), and the dry-run choice is
made there once: the doors and the loops get ``RecordingApplier`` in a dry run and
``FileApplier`` otherwise."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest

from runtime_proxy import compose
from runtime_proxy.commands import hook_server, nri, plan, serve
from runtime_proxy.config import ProxyConfig
from runtime_proxy.host.apply import FileApplier, RecordingApplier


def _config(tmp_path: Path, **kw: Any) -> ProxyConfig:
    base: dict[str, Any] = {"resctrlRoot": str(tmp_path / "no-resctrl"), "cgroupRoot": str(tmp_path / "cg"),
                            "hookServerDir": str(tmp_path / "hooks")}
    base.update(kw)
    return ProxyConfig.model_validate(base)


@pytest.mark.parametrize(
    ("flag", "setting", "recording"),
    [
        pytest.param(False, False, False, id="no dry run: the file applier"),
        pytest.param(True, False, True, id="--dry-run: the recording applier"),
        pytest.param(False, True, True, id="dryRun in the config: the recording applier"),
    ],
)
def test_build_chooses_the_applier_once(tmp_path: Path, flag: bool, setting: bool, recording: bool) -> None:
    parts = compose.build(_config(tmp_path, dryRun=setting), dry_run=flag, entry_points=False)
    assert isinstance(parts.applier, RecordingApplier) is recording
    assert isinstance(parts.applier, FileApplier) is not recording
    assert parts.applier.cgroups is not None, "the loops read through the applier's trees"
    assert parts.dry_run is recording


async def test_every_command_that_runs_plugins_builds_through_the_root(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[ProxyConfig] = []
    real = compose.build

    def spy(config: ProxyConfig, **kw: Any) -> compose.Parts:
        built.append(config)
        return real(config, **kw)

    monkeypatch.setattr(compose, "build", spy)
    config = _config(tmp_path)
    proxy = serve.Proxy(serve.ProxyOptions(listen=str(tmp_path / "p.sock"), backend=str(tmp_path / "c.sock"),
                                           config=config, entry_points=False))
    await proxy.client.close()
    nri.build(nri.NriOptions(socket=str(tmp_path / "nri.sock"), config=config, entry_points=False))
    hook_server.build(hook_server.HookServerOptions(listen=str(tmp_path / "h.sock"), config=config,
                                                    entry_points=False))
    assert built == [config, config, config]


def test_plan_loads_its_plugins_through_the_root(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    asked: list[bool] = []
    real = compose.plugin_manager

    def spy(config: ProxyConfig, **kw: Any) -> Any:
        asked.append(kw.get("entry_points", True))
        return real(config, **kw)

    monkeypatch.setattr(compose, "plugin_manager", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"stage": "ReconcileNode"})))
    assert plan.main(["--no-entry-points", "-o", "json"]) == 0
    assert asked == [False]
    assert json.loads(capsys.readouterr().out)["stage"] == "ReconcileNode"


def test_flags_override_the_config_file_only_where_given(tmp_path: Path) -> None:
    config = _config(tmp_path, cgroupDriver="systemd")
    args = argparse.Namespace(cgroup_root="/elsewhere", cgroup_driver=None, node_config=None)
    changed = compose.with_flags(config, args)
    assert (changed.cgroupRoot, changed.cgroupDriver, changed.hookServerDir) == (
        "/elsewhere", "systemd", str(tmp_path / "hooks"))


def test_a_plugin_module_that_does_not_import_is_named(tmp_path: Path) -> None:
    with pytest.raises(compose.PluginLoadError, match="pluginModules entry 'no_such_module_here' cannot be loaded"):
        compose.build(_config(tmp_path, pluginModules=["no_such_module_here"]), entry_points=False)
