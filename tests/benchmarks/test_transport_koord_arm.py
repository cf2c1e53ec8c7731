"""The koord-runtime-proxy target of ``benchmarks/transport/run.py`` is optional: without the binary
(scripts/build-koord.sh builds it, and CI does not) the benchmark says why it skipped that target
and still measures the others; with the binary (the last test, skipped when it is not built) the
target answers every measurement, its intercepted CreateContainer included, which needs the pod
run first: koord-runtime-proxy v1.8.0 crashes on a CreateContainer for a pod it has not seen.
What is checked is the plumbing and the table's shape, never a speed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "transport" / "run.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("transport_run_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--rounds", "1", "--only", "relay", *args],
                          capture_output=True, text=True, env=env, timeout=840, stdin=subprocess.DEVNULL,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def test_missing_binary_skips_the_target_with_the_reason(tmp_path: Path) -> None:
    binary, why = _load().koord_binary(str(tmp_path / "koord-runtime-proxy"))
    assert binary is None
    assert why == f"no binary at {tmp_path / 'koord-runtime-proxy'} (bash scripts/build-koord.sh builds it)"


def test_a_registered_hook_server_skips_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _load()
    binary = tmp_path / "koord-runtime-proxy"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    hooks = tmp_path / "hookserver.d"
    hooks.mkdir()
    monkeypatch.setattr(bench, "KOORD_HOOK_DIR", hooks)
    assert bench.koord_binary(str(binary)) == (binary, "")
    (hooks / "koordlet.json").write_text("{}")
    found, why = bench.koord_binary(str(binary))
    assert found is None and "koordlet.json" in why and "not a pass-through" in why


def test_the_created_container_belongs_to_the_pod_the_echo_runs() -> None:
    from cri_protos import api_pb2

    run_bytes, create_bytes = _load().koord_pod()
    run = api_pb2.RunPodSandboxRequest.FromString(run_bytes)
    create = api_pb2.CreateContainerRequest.FromString(create_bytes)
    # the echo server answers RunPodSandbox with the request's bytes: field 1 becomes the pod's id
    echoed = api_pb2.RunPodSandboxResponse.FromString(run_bytes)
    assert echoed.pod_sandbox_id == create.pod_sandbox_id == run.config.SerializeToString().decode()
    assert create.config.metadata.name == "app" and create.sandbox_config == run.config


# slow: runs the benchmark end to end with proxy processes (48 s and 28 s in the unit tier on
# the loaded machine): the full suite runs it, the fast tier (scripts/test.sh --unit) does not.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rounds_without_the_binary_still_measure_the_others(tmp_path: Path) -> None:
    absent = tmp_path / "koord-runtime-proxy"
    out = _run("--koord", str(absent))
    assert f"koord-runtime-proxy target skipped: no binary at {absent}" in out, out
    assert "| measure | direct | relay |" in out, out
    assert "| koord" not in out and " koord |" not in out, out


@pytest.mark.requires_root  # koord-runtime-proxy creates its fixed hook directory under /etc
@pytest.mark.timeout(900)
def test_the_koord_target_answers_every_measurement() -> None:
    bench = _load()
    binary, why = bench.koord_binary(None)
    if binary is None:
        pytest.skip(f"koord-runtime-proxy not built: {why}")
    had_hook_dir = bench.KOORD_HOOK_DIR.exists()
    out = _run("--koord", str(binary))
    assert "| measure | direct | relay | koord |" in out, out
    cell = r"-?[0-9.]+ \[-?[0-9.]+, -?[0-9.]+\]"
    for label in ("pass-through unary p50 (us)", "intercepted unary p50 (us)", "16-concurrent throughput (calls/s)",
                  "1000-message stream p50 (ms)"):  # fmt: skip
        assert re.search(rf"^\| {re.escape(label)} \| {cell} \| {cell} \| {cell} \|$", out, re.MULTILINE), out
    for label in ("proxy CPU per pass-through call (us)", "proxy peak RSS (MiB)"):
        assert re.search(rf"^\| {re.escape(label)} \| n/a \| {cell} \| {cell} \|$", out, re.MULTILINE), out
    assert bench.KOORD_HOOK_DIR.exists() == had_hook_dir
