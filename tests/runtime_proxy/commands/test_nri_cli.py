"""``runtime-proxy nri`` argument handling and wiring (no runtime needed)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest
import structlog

from runtime_proxy.commands.nri import NriOptions, add_parser, build, main_from_args, run
from runtime_proxy.config import ProxyConfig
from runtime_proxy.host.apply import RecordingApplier
from runtime_proxy.nri.plugin import NriPlugin, PluginIdentity
from tests.runtime_proxy.nri.fake_runtime import FakeRuntime


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--plugin-idx", "7"], id="a one-digit index is a usage error"),
        pytest.param(["--plugin-name", "bad name"], id="a name with a space is a usage error"),
        pytest.param(["--config", "/nonexistent/rhp.yaml"], id="a missing config file is a usage error"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    assert main_from_args(parser.parse_args(["nri", *argv])) == 2
    assert "runtime-proxy nri:" in capsys.readouterr().err


def test_build_uses_the_same_config_as_serve(tmp_path: Path) -> None:
    config = ProxyConfig(plugins=[{"name": "cpuset", "policy": "Fail"}], dryRun=True,  # type: ignore[list-item]
                         hookServerDir=str(tmp_path), cgroupRoot=str(tmp_path))
    parts = build(NriOptions(socket=str(tmp_path / "nri.sock"), config=config, entry_points=False))
    plugin, engine = parts.plugin, parts.engine
    assert [(s.name, s.policy) for s in engine.pipeline.steps] == [("cpuset", "Fail")]
    assert isinstance(engine.core.applier, RecordingApplier)
    assert plugin.socket_path == str(tmp_path / "nri.sock")


async def test_run_registers_and_stops_on_request(tmp_path: Path) -> None:
    runtime = await FakeRuntime(tmp_path / "nri.sock").start()
    config = ProxyConfig(hookServerDir=str(tmp_path / "hooks"), cgroupRoot=str(tmp_path))
    stop = asyncio.Event()
    task = asyncio.create_task(run(NriOptions(socket=str(runtime.path), identity=PluginIdentity("rhp", "42"),
                                              config=config, entry_points=False), stop))
    try:
        session = await runtime.next_session()
        await asyncio.wait_for(session.registered.wait(), 5)
        assert [(r.plugin_name, r.plugin_idx) for r in runtime.registrations] == [("rhp", "42")]
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await runtime.stop()


async def test_run_with_the_packaged_plugins_logs_that_the_usage_loop_runs(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """nri with the ConfigMap's plugins (no usageLoop.enable) starts the usage loop and says why."""
    import yaml

    from runtime_proxy import wiring

    monkeypatch.setattr(wiring, "log", structlog.get_logger(wiring.__name__))
    configmap = Path(__file__).resolve().parents[3] / "packaging/kustomize/base/node/configmap.yaml"
    packaged = yaml.safe_load(yaml.safe_load(configmap.read_text())["data"]["config.yaml"])
    config = ProxyConfig.model_validate({**packaged, "fromCluster": False, "cgroupRoot": str(tmp_path),
                                         "hookServerDir": str(tmp_path / "hooks")})
    runtime = await FakeRuntime(tmp_path / "nri.sock").start()
    stop = asyncio.Event()
    saved = structlog.get_config()
    structlog.reset_defaults()  # whatever level an earlier test's command line set
    try:
        with structlog.testing.capture_logs() as logs:
            task = asyncio.create_task(run(NriOptions(socket=str(runtime.path), config=config, entry_points=False),
                                           stop))
            session = await runtime.next_session()
            await asyncio.wait_for(session.registered.wait(), 5)
            stop.set()
            await asyncio.wait_for(task, 5)
    finally:
        structlog.configure(**saved)
        await runtime.stop()
    (line,) = [e for e in logs if e["event"] == "periodic loops"]
    assert line["usage_loop"] is True
    assert line["usage_loop_why"] == (
        "enabled plugins implement ReconcileUsage: cpu_suppress, memory_qos, memory_evict, cpu_evict"
    )


@pytest.mark.parametrize(
    ("make", "said"),
    [
        pytest.param(lambda p: None, "no NRI socket at {path}: is NRI enabled", id="a missing socket is named"),
        pytest.param(lambda p: p.write_text(""), "cannot connect to the NRI socket {path}: Connection refused",
                     id="a file that is no socket is named"),
    ],
)
async def test_a_socket_that_cannot_be_dialled_is_named(tmp_path: Path, make: object, said: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconnect warning says which socket failed and, when it is missing, what to check."""
    from runtime_proxy.nri import plugin as plugin_module

    # A logger proxy not yet bound, so capture_logs sees its lines whatever ran before.
    monkeypatch.setattr(plugin_module, "log", structlog.get_logger(plugin_module.__name__))
    path = tmp_path / "nri.sock"
    make(path)  # type: ignore[operator]
    build_parts = build(NriOptions(socket=str(path), config=ProxyConfig(cgroupRoot=str(tmp_path)), entry_points=False))
    plugin = NriPlugin(PluginIdentity("rhp", "42"), build_parts.engine, socket_path=str(path), backoff=(0.01, 0.05))
    stop = asyncio.Event()
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(plugin.run(stop))
        try:
            async with asyncio.timeout(10):
                while not any(e["event"] == "NRI session ended; reconnecting" for e in logs):
                    await asyncio.sleep(0.01)
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            await build_parts.engine.close()
    warning = next(e for e in logs if e["event"] == "NRI session ended; reconnecting")
    assert warning["socket"] == str(path)
    assert warning["error"].startswith(said.format(path=path))


def test_the_daemonset_manifest_matches_the_cli_and_the_config_schema(tmp_path: Path) -> None:
    import yaml

    from runtime_proxy.config import load_config

    repo = Path(__file__).resolve().parents[3]
    base = repo / "packaging" / "kustomize" / "base"
    docs = [*yaml.safe_load_all((base / "node" / "configmap.yaml").read_text()),
            *yaml.safe_load_all((base / "nri" / "daemonset.yaml").read_text())]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(config_map["data"]["config.yaml"])
    load_config(str(config_file))  # raises on an unknown or invalid key
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["runtime-proxy", "nri"]
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(container["command"][1:])
    assert PluginIdentity(args.plugin_name, args.plugin_idx).idx == "50"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/run/nri", "/sys/fs/cgroup"} <= mounts
    assert container["securityContext"].get("privileged") is not True


_NO_GRPC = """
import asyncio, json, socket, sys
from pathlib import Path
import runtime_proxy.cli
from cri_protos import nri_pb2
from runtime_proxy.config import ProxyConfig
from runtime_proxy.commands.nri import NriOptions, run
from runtime_proxy.nri.plugin import NriPlugin, PluginIdentity
from tests.runtime_proxy.nri.fake_runtime import FakeRuntime

async def main(tmp):
    runtime_proxy.cli.build_parser()  # what `runtime-proxy nri` does first: every sub-command's parser
    runtime = await FakeRuntime(tmp / "nri.sock").start()
    hooks = tmp / "hooks"
    hooks.mkdir()
    config = ProxyConfig(hookServerDir=str(hooks), cgroupRoot=str(tmp), usageLoop={"enable": True})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stop = asyncio.Event()
    task = asyncio.create_task(run(NriOptions(socket=str(runtime.path), identity=PluginIdentity("rhp", "42"),
                                              config=config, entry_points=False, metrics_addr=f"127.0.0.1:{port}"),
                                   stop))
    session = await runtime.next_session()
    await asyncio.wait_for(session.registered.wait(), 5)
    await session.call("Configure", nri_pb2.ConfigureRequest(runtime_name="fake", runtime_version="1"))
    await session.call("Synchronize", nri_pb2.SynchronizeRequest())
    await asyncio.sleep(0.5)  # the loops start once synchronized
    loaded = sorted(m for m in sys.modules if m == "grpc" or m.startswith("grpc."))
    stop.set()
    await asyncio.wait_for(task, 5)
    await runtime.stop()
    print(json.dumps(loaded))

asyncio.run(main(Path(sys.argv[1])))
"""


def test_the_nri_plugin_never_loads_the_grpc_library(tmp_path: Path) -> None:
    """gRPC takes about 10 MiB of a Python process's memory and the NRI plugin speaks ttrpc:
    with its CLI parser built, registered, synchronized, with its loops, metrics and an empty
    hook-server directory, the plugin has not imported it (it loads with a hook server's
    registration or ``--backend``)."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[3]
    out = subprocess.run([sys.executable, "-c", _NO_GRPC, str(tmp_path)], cwd=repo, capture_output=True,
                         text=True, timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
