"""The reporter in the composition root: ``wiring.loops`` (what ``serve`` and ``nri`` start,
through ``compose.loops``) builds it only with ``report.enable``, reading the usage loop's sampler when
that loop runs and sampling on its own otherwise; the config keys are strict."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hooks.manager import make_plugin_manager
from runtime_proxy import wiring
from runtime_proxy.config import ConfigError, ProxyConfig, load_config
from runtime_proxy.engine.pipeline import Pipeline, plugin_steps
from runtime_proxy.report.loop import Reporter
from tests.runtime_proxy.fake_backend import FakeBackend


async def _loops(tmp_path: Path, **kw: Any) -> wiring.Loops:
    config = ProxyConfig.model_validate({"resctrlRoot": str(tmp_path / "no"), "cgroupRoot": str(tmp_path / "cg"),
                                         "cgroupDriver": "cgroupfs", **kw})
    pm = make_plugin_manager(entry_points=False)
    pipeline = Pipeline(plugin_steps(pm, wiring.plugin_settings(config, pm, entry_points=False)))
    node, _ = wiring.node_source(config)
    return wiring.loops(config, FakeBackend(), pm=pm, pipeline=pipeline, applier=wiring.applier(config),
                        node_source=node, ready=asyncio.Event(), runtime=object())


async def test_off_by_default(tmp_path: Path) -> None:
    loops = await _loops(tmp_path)
    try:
        assert loops.reporter is None
    finally:
        await loops.stop()


@pytest.mark.parametrize(("plugins", "shared"), [(["cpu_suppress"], True), (["cpuset"], False)])
async def test_on_with_the_usage_loops_sampler_or_its_own(tmp_path: Path, plugins: list[str], shared: bool) -> None:
    loops = await _loops(tmp_path, plugins=[{"name": p} for p in plugins], usageLoop={"evictBy": "runtime"},
                         report={"enable": True, "kubeletConfigFile": ""})
    try:
        assert isinstance(loops.reporter, Reporter)
        assert loops.reporter.shared_sampler is shared
        if shared:
            assert loops.usage is not None and loops.reporter.sampler is loops.usage.sampler
    finally:
        await loops.stop()


def test_report_keys_are_strict(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("report:\n  enabel: true\n")
    with pytest.raises(ConfigError, match="enabel"):
        load_config(str(path))
    path.write_text("report:\n  intervalSeconds: 0\n")
    with pytest.raises(ConfigError):
        load_config(str(path))


def test_report_needs_the_kubernetes_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from runtime_proxy.config import check_usable

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kubernetes" else real(name, *a))
    with pytest.raises(ConfigError, match=r"report.enable needs the kubernetes client"):
        check_usable(ProxyConfig.model_validate({"report": {"enable": True}}))
    check_usable(ProxyConfig())
