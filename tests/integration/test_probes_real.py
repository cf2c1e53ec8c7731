"""The proxy's probes on real containerd: ``/readyz`` is 200 once the store is rebuilt, 503
while containerd is down (``/healthz`` stays 200) and 200 again when it is back; and doctor's
runtime check against the same containerd, up and down."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rhp_devenv.kube import free_port as _free_port

from tests.integration.harness import ProxyThread, proxy_options

pytestmark = pytest.mark.integration


def _status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait_status(port: int, path: str, code: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while _status(port, path) != code:
        assert time.monotonic() < deadline, f"{path} never answered {code}"
        time.sleep(0.1)


def test_readyz_follows_containerd_down_and_back(containerd: Any, tmp_path: Path) -> None:
    port = _free_port()
    opts = proxy_options(containerd, tmp_path, "relay", metrics_addr=f"127.0.0.1:{port}")
    with ProxyThread(opts):
        assert _status(port, "/healthz") == 200
        assert _status(port, "/readyz") == 200
        assert _status(port, "/nothing") == 404
        containerd.ctrd.kill_daemon()
        _wait_status(port, "/readyz", 503)
        assert _status(port, "/healthz") == 200
        containerd.ctrd.restart_daemon()
        _wait_status(port, "/readyz", 200)


def test_doctor_sees_containerd_answer_cri_v1(containerd: Any) -> None:
    from runtime_proxy.commands import doctor

    opts = doctor.DoctorOptions(backend=str(containerd.socket), skip=frozenset(doctor.CHECKS) - {"runtime"})
    (check,) = doctor.run(opts)
    assert check.status == "ok", check.detail
    assert check.detail.startswith("containerd ") and ", CRI v1 at " in check.detail
    containerd.ctrd.kill_daemon()
    try:
        (check,) = doctor.run(opts)
        assert check.status == "fail"
    finally:
        containerd.ctrd.restart_daemon()
