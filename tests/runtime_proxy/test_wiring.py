"""``runtime_proxy.wiring``'s start-up decisions: which plugins run (hardware the node lacks,
entry-point plugins left out), whether the usage loop runs and why, kubelet's cgroup driver."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from hooks.manager import make_plugin_manager
from runtime_proxy import wiring
from runtime_proxy.config import ProxyConfig
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from tests.runtime_proxy.fake_backend import FakeBackend


@pytest.fixture(autouse=True)
def fresh_logger(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """structlog's defaults and a logger proxy not yet bound, whatever an earlier test's command
    line set up (the shared set-up filters by level and caches a logger on first use, after which
    ``capture_logs`` would miss its info lines); the set-up is put back afterwards."""
    saved = structlog.get_config()
    structlog.reset_defaults()
    monkeypatch.setattr(wiring, "log", structlog.get_logger(wiring.__name__))
    try:
        yield
    finally:
        structlog.configure(**saved)


def _config(tmp_path: Path, **kw: Any) -> ProxyConfig:
    base: dict[str, Any] = {"resctrlRoot": str(tmp_path / "no-resctrl"), "cgroupRoot": str(tmp_path / "cg")}
    base.update(kw)
    return ProxyConfig.model_validate(base)


def _pipeline(config: ProxyConfig) -> tuple[Any, Pipeline]:
    pm = make_plugin_manager(entry_points=False)
    return pm, Pipeline(plugin_steps(pm, wiring.plugin_settings(config, pm, entry_points=False)))


@pytest.mark.parametrize(
    ("plugins", "enable", "runs", "why"),
    [
        pytest.param(["cpuset", "cpu_suppress"], None, True, "enabled plugins implement ReconcileUsage: cpu_suppress",
                     id="an enabled cpu_suppress runs the loop without usageLoop.enable"),
        pytest.param(["memory_evict", "cpu_evict"], None, True,
                     "enabled plugins implement ReconcileUsage: memory_evict, cpu_evict",
                     id="the eviction plugins run the loop"),
        pytest.param(["cpuset", "group_identity"], None, False, "no enabled plugin implements ReconcileUsage",
                     id="no ReconcileUsage plugin, no loop"),
        pytest.param(["cpu_suppress"], False, False, "usageLoop.enable is false; ReconcileUsage of cpu_suppress will "
                     "not run", id="enable false turns it off and says what will not run"),
        pytest.param(["cpuset"], True, True, "usageLoop.enable is true", id="enable true runs it anyway"),
        pytest.param(None, None, True,
                     "enabled plugins implement ReconcileUsage: cpu_suppress, memory_qos, memory_evict, cpu_evict",
                     id="without a plugin list every built-in is on, so the loop is too"),
    ],
)
def test_the_usage_loop_runs_when_a_plugin_needs_it(tmp_path: Path, plugins: list[str] | None, enable: bool | None,
                                                    runs: bool, why: str) -> None:
    config = _config(tmp_path, plugins=None if plugins is None else [{"name": p} for p in plugins],
                     usageLoop={"enable": enable})
    pm, pipeline = _pipeline(config)
    assert wiring.usage_loop_decision(config, pm, pipeline) == (runs, why)


async def test_the_loops_log_which_run_and_why(tmp_path: Path) -> None:
    """The start names every loop and why the usage loop runs (the packaged configs list
    cpu_suppress and the evictions without usageLoop.enable)."""
    config = _config(tmp_path, plugins=[{"name": "cpu_suppress"}], usageLoop={"evictBy": "runtime"})
    pm, pipeline = _pipeline(config)
    node, _ = wiring.node_source(config)
    with capture_logs() as logs:
        loops = wiring.loops(config, FakeBackend(), pm=pm, pipeline=pipeline, applier=wiring.applier(config),
                             node_source=node, ready=asyncio.Event(), runtime=object())
    try:
        (line,) = [e for e in logs if e["event"] == "periodic loops"]
        assert line["usage_loop"] is True and line["usage_loop_why"].endswith("cpu_suppress")
        assert "reconciler" in line and "cpu_burst" in line
        assert loops.usage is not None
    finally:
        await loops.stop()


def test_rdt_without_resctrl_is_skipped_with_a_warning(tmp_path: Path) -> None:
    config = _config(tmp_path, plugins=[{"name": "cpuset"}, {"name": "rdt"}, {"name": "group_identity"}])
    pm = make_plugin_manager(entry_points=False)
    with capture_logs() as logs:
        settings = wiring.plugin_settings(config, pm, entry_points=False)
    assert [name for name, _, _ in settings] == ["cpuset", "group_identity"]
    (warning,) = [e for e in logs if e["event"] == "plugin skipped: this node lacks what it needs"]
    assert warning["plugin"] == "rdt" and f"no resctrl at {tmp_path / 'no-resctrl'}" in warning["reason"]
    assert warning["log_level"] == "warning"


def test_rdt_runs_where_resctrl_is(tmp_path: Path) -> None:
    (tmp_path / "resctrl" / "info" / "L3").mkdir(parents=True)
    (tmp_path / "resctrl" / "info" / "L3" / "cbm_mask").write_text("fff\n")
    config = _config(tmp_path, resctrlRoot=str(tmp_path / "resctrl"), plugins=[{"name": "rdt"}])
    assert [n for n, _, _ in wiring.plugin_settings(config, make_plugin_manager(entry_points=False))] == ["rdt"]


@pytest.mark.parametrize(
    ("plugins", "entry_points", "warned"),
    [
        pytest.param([{"name": "cpuset"}], True, {"ext": "not in the config's plugins"},
                     id="an installed plugin the config leaves out is named"),
        pytest.param([{"name": "cpuset"}, {"name": "ext"}], True, None, id="a listed plugin is not"),
        pytest.param([{"name": "cpuset"}, {"name": "ext", "enabled": False}], True, None,
                     id="a plugin listed as disabled is a choice, not warned about"),
        pytest.param(None, True, None, id="without a list every installed plugin runs"),
        pytest.param(None, False, {"ext": "--no-entry-points"}, id="--no-entry-points leaves it out, named"),
    ],
)
def test_an_installed_entry_point_plugin_left_out_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                            plugins: list[dict[str, Any]] | None, entry_points: bool,
                                                            warned: dict[str, str] | None) -> None:
    from hooks.plugins import cpuset

    class Ext:
        pass

    monkeypatch.setattr(wiring, "installed_entry_points", lambda: ["ext"])
    pm = make_plugin_manager(builtins=(), entry_points=False)
    pm.register(cpuset, name="cpuset")
    if entry_points:
        pm.register(Ext(), name="ext")
    with capture_logs() as logs:
        wiring.plugin_settings(_config(tmp_path, plugins=plugins), pm, entry_points=entry_points)
    seen = [e["plugins"] for e in logs if e["event"].startswith("installed entry-point plugins will not run")]
    assert seen == ([warned] if warned else [])


@pytest.mark.parametrize(
    ("configured", "made", "driver", "level"),
    [
        pytest.param(None, "kubepods.slice", "systemd", "info", id="unset, kubepods.slice: systemd"),
        pytest.param(None, "kubepods", "cgroupfs", "info", id="unset, kubepods: cgroupfs"),
        pytest.param(None, "", "cgroupfs", "warning", id="unset, nothing yet: cgroupfs with a warning"),
        pytest.param("systemd", "kubepods", "systemd", None, id="a configured driver wins, nothing detected"),
    ],
)
def test_the_cgroup_driver_is_detected_unless_set(tmp_path: Path, configured: str | None, made: str, driver: str,
                                                  level: str | None) -> None:
    (tmp_path / "cg" / "cpu").mkdir(parents=True)
    if made:
        (tmp_path / "cg" / "cpu" / made).mkdir()
    with capture_logs() as logs:
        got = wiring.cgroup_driver(_config(tmp_path, cgroupDriver=configured))
    assert got == driver
    assert [e["log_level"] for e in logs if "cgroup driver" in e["event"]] == ([level] if level else [])


def test_serves_check_of_the_config_does_not_announce_twice(tmp_path: Path) -> None:
    """serve checks the plugins before it starts (check_plugins), then the start logs what it
    leaves out: the skip is logged once, by the start."""
    from runtime_proxy import compose

    config = _config(tmp_path, plugins=[{"name": "cpuset"}, {"name": "rdt"}])
    with capture_logs() as logs:
        compose.check_plugins(config, entry_points=False)
        wiring.plugin_settings(config, make_plugin_manager(entry_points=False), entry_points=False)
    assert [e["plugin"] for e in logs if e["event"].startswith("plugin skipped")] == ["rdt"]
