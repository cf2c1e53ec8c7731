"""The koord-runtime-proxy arm of ``benchmarks/proxy_overhead.py --rounds`` is optional: without
the binary (scripts/build-koord.sh builds it, and CI does not) the benchmark says why it skipped
that arm and still measures the others; a hook server registered in koord-runtime-proxy's fixed
hook directory would make that arm no pass-through, so it is skipped then too. What is checked is
the plumbing and the table's shape, never a speed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from rhp_devenv.containerd import binaries_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "proxy_overhead.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("proxy_overhead_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_binary_skips_the_arm_with_the_reason(tmp_path: Path) -> None:
    binary, why = _load().koord_binary(str(tmp_path / "koord-runtime-proxy"))
    assert binary is None
    assert why == f"no binary at {tmp_path / 'koord-runtime-proxy'} (bash scripts/build-koord.sh builds it)"


def test_a_registered_hook_server_skips_the_arm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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


@pytest.mark.requires_root
@pytest.mark.timeout(900)
def test_rounds_without_the_binary_still_measure_direct_and_ours(tmp_path: Path) -> None:
    if binaries_for("1.6").missing():
        pytest.skip("containerd 1.6 is not installed; scripts/install-deps.sh installs it")
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'devenv'}"}
    absent = tmp_path / "koord-runtime-proxy"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "1", "--quick", "--koord", str(absent)],
                          capture_output=True, text=True, env=env, timeout=840, stdin=subprocess.DEVNULL,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, f"exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    out = proc.stdout
    assert f"koord-runtime-proxy arm skipped: no binary at {absent}" in out, out
    assert "| measure | direct | ours, every plugin | ours, no plugins |" in out, out
    cell = r"[0-9.]+ \[[0-9.]+, [0-9.]+\]"
    for measure, direct in (("Version p50, ms", cell), ("pod lifecycle (7 calls) p50, ms", cell),
                            ("proxy RSS per round, MiB", "n/a")):
        assert re.search(rf"^\| {re.escape(measure)} \| {direct} \| {cell} \| {cell} \|$", out, re.MULTILINE), \
            f"no {measure} row:\n{out}"
    assert "koord-runtime-proxy |" not in out, out
