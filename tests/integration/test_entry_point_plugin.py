"""A third-party plugin package installed with pip is found through the entry-point group
``runtime_hook_proxy.plugins`` and runs in the proxy."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cri_protos import api_pb2
from tests.integration.harness import REPO, ProxyProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hello_plugin_installed() -> Iterator[None]:
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", str(REPO / "examples" / "hello_plugin")],
                   check=True)
    try:
        yield
    finally:
        subprocess.run([*pip, "uninstall", "-y", "rhp-hello-plugin"], check=False)


def test_entry_point_plugin_runs_in_proxy(
    hello_plugin_installed: None, containerd: Any, cri_client: Any, tmp_path: Path
) -> None:
    from hooks.manager import make_plugin_manager

    found = subprocess.run(
        [sys.executable, "-c", "from hooks.manager import make_plugin_manager as m; "
         "print(m(builtins=()).get_plugin('rhp_hello_plugin') is not None)"],
        capture_output=True, text=True, check=True,
    )
    assert found.stdout.strip() == "True"
    del make_plugin_manager
    listen = str(tmp_path / "proxy.sock")
    proxy = ProxyProcess(["--backend", str(containerd.socket), "--transport", "grpc",
                          "--hook-server-dir", str(tmp_path / "hs.d")], log=tmp_path / "proxy.log").start(listen)
    try:
        client = cri_client(listen)
        pod = client.run_pod(cgroup_parent=containerd.new_cgroup_parent(), labels={"example.com/hello": "true"},
                             name="greeter")
        cid = client.run_container(pod)
        out = client.runtime.ExecSync(api_pb2.ExecSyncRequest(container_id=cid, cmd=["env"], timeout=10), timeout=20)
        assert "HELLO_FROM=default/greeter" in out.stdout.decode()
        assert client.container_status(cid).annotations["example.com/greeted"] == "true"
    finally:
        assert proxy.terminate() == 0
