"""Restart: kill -9 the extender while binds are in flight; a new process rebuilds its cache from
pod annotations and allocates around every CPU already handed out. Also the CLI dry-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from rhp_devenv.kube import free_port as _free_port

from koord_formats.topology import format_cpu_topology
from scheduler_ext.cli import main
from tests.fakeapi import FakeAPIServer
from tests.scheduler_ext.builders import TOPO_QUAD_NUMA, cluster, cpus, pod
from tests.scheduler_ext.conftest import signing_key_file

RS = "scheduling.koordinator.sh/resource-status"
ROOT = Path(__file__).resolve().parents[2]


def _spawn(api_url: str, key: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler_ext.cli", "serve", "--api-server", api_url,
         "--listen", f"127.0.0.1:{port}", "--log-level", "warning", "--signing-key-file", str(key)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # a loaded 2-core machine took more than 30 s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise TimeoutError("extender did not become ready")


def _bind(url: str, p: dict[str, Any]) -> str:
    body = {"PodName": p["metadata"]["name"], "PodNamespace": "default",
            "PodUID": p["metadata"]["uid"], "Node": "n1"}
    try:
        return str(httpx.post(f"{url}/bind", json=body, timeout=10).json()["Error"])
    except httpx.HTTPError as exc:  # the process was killed under us
        return f"transport: {exc}"


def test_killed_extender_is_replaced_without_double_allocation(api: FakeAPIServer, tmp_path: Path) -> None:
    key = signing_key_file(tmp_path)  # the new process verifies the signatures of the old one's binds
    pods = [pod(f"p{i:02d}", cpu="2") for i in range(20)]  # 40 CPUs asked, node has 32
    for obj in [*cluster(["n1"], format_cpu_topology(TOPO_QUAD_NUMA)), *pods]:
        api.create(obj)
    first, url = _spawn(api.url, key)
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(_bind, url, p) for p in pods[:10]]
            while sum(1 for p in api.objects("pods") if p["spec"].get("nodeName")) < 4:
                time.sleep(0.002)
            os.kill(first.pid, signal.SIGKILL)  # mid-stream: some binds are still in flight
            [f.result() for f in futures]
    finally:
        first.kill()
        first.wait()
    before = {p["metadata"]["name"] for p in api.objects("pods") if p["spec"].get("nodeName")}
    assert 4 <= len(before) <= 10
    second, url = _spawn(api.url, key)
    try:
        for p in pods:
            if p["metadata"]["name"] not in before:
                _bind(url, p)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(10)
    bound = [p for p in api.objects("pods") if p["spec"].get("nodeName") == "n1"]
    sets = [cpus(json.loads(p["metadata"]["annotations"][RS])["cpuset"]) for p in bound]
    assert len(bound) == 16  # the node is full: every CPU handed out exactly once
    assert len(frozenset().union(*sets)) == sum(len(s) for s in sets) == 32


def test_simulate_reads_yaml_and_prints_what_a_bind_would_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    placed = pod("old", cpu="8", node_name="a", annotations={RS: json.dumps({"cpuset": "0-3,8-11"})})
    doc = {"objects": [*cluster(["a", "b"]), placed],
           "pod": pod("new", cpu="4", numa_policy="SingleNUMANode")}
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["simulate", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pod"] == "default/new" and out["selected"] == "b"
    by_name = {n["name"]: n for n in out["nodes"]}
    assert set(by_name["a"]) == {"name", "feasible", "unresolvable", "reason", "score", "annotations"}
    assert json.loads(by_name["a"]["annotations"][RS])["cpuset"] == "4-5,12-13"  # around pod "old"
    assert by_name["b"]["score"] > by_name["a"]["score"]


@pytest.mark.parametrize(
    ("text", "code"),
    [("[]", 3), ("{\"objects\": []}", 3), (": not yaml :", 3)],
    ids=["not-an-object", "no-pod", "garbage"],
)
def test_simulate_rejects_bad_documents(tmp_path: Path, text: str, code: int) -> None:
    path = tmp_path / "doc"
    path.write_text(text)
    assert main(["simulate", str(path)]) == code
