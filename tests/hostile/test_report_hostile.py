"""Hostile answers to the node's reports cost only their own object.

A hostile API server answers the GET of one object with garbage, a body above the bound, JSON
nested too deep, a number too long, an object of the wrong shape, or nothing at all: the writer
refuses it unparsed or as a FormatError (``ApiError`` status 0), the reporter counts an error for
that object only, and the other objects are still read and written in the same round.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import kubernetes
import pytest

from hooks.facts import ContainerFacts, NodeFacts, PodFacts
from runtime_proxy.host.cgroups import Cgroups
from runtime_proxy.report.config import ReportConfig
from runtime_proxy.report.loop import DEVICE, NRT, WRITES, Reporter
from runtime_proxy.report.writer import MAX_OBJECT_BYTES, ApiError, KubeObjects
from tests.fake_sysfs import add_nvidia_gpu, write_topology
from tests.topologies import DUAL_SOCKET_HT

NODE = "n1"
BIG = b'{"a":"' + b"x" * (MAX_OBJECT_BYTES + 10) + b'"}'
ANSWERS: dict[str, tuple[int, bytes]] = {
    "garbage": (200, b"\x00\xff not json"),
    "huge": (200, BIG),
    "deep": (200, b"[" * 100_000 + b"]" * 100_000),
    "digits": (200, b'{"zones":[' + b"9" * 5000 + b"]}"),
    "list": (200, b"[1,2,3]"),
    "zones": (200, json.dumps({"metadata": {"name": NODE}, "zones": [{"name": "z", "type": "Node"}] * 300}).encode()),
    "devices": (200, json.dumps({"metadata": {"name": NODE}, "spec": {"devices": [{}] * 2000}}).encode()),
    "error-body": (500, b"x" * (MAX_OBJECT_BYTES + 10)),
}


class _Hostile(BaseHTTPRequestHandler):
    """GET of ``target`` answers ``mode``; the other objects are served sanely (404, then what was
    written)."""

    mode: ClassVar[str] = "garbage"
    target: ClassVar[str] = "noderesourcetopologies"
    stored: ClassVar[dict[str, bytes]] = {}

    def log_message(self, *args: Any) -> None:
        return

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # The writer under test hangs up on a body past its bound, as it should: no traceback
        # from this server's thread (a fast-tier worker prints what its threads print).
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def do_GET(self) -> None:
        if self.target in self.path:
            if self.mode == "hang":
                time.sleep(3)
                return
            self._send(*ANSWERS[self.mode])
        elif self.path in self.stored:
            self._send(200, self.stored[self.path])
        else:
            self._send(404, b'{"kind":"Status","code":404}')

    def _write(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        path = self.path if self.command == "PUT" else self.path + "/" + json.loads(body)["metadata"]["name"]
        self.stored[path] = body
        self._send(200, body)

    do_POST = do_PUT = _write


@pytest.fixture
def server() -> Iterator[str]:
    _Hostile.stored = {}
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _objects(url: str) -> KubeObjects:
    conf = kubernetes.client.Configuration()
    conf.host = url
    return KubeObjects(kubernetes.client.ApiClient(conf), timeout=1.0)


class _Backend:
    def node(self) -> NodeFacts:
        return NodeFacts(name=NODE)

    def pods(self) -> list[PodFacts]:
        return []

    def containers(self) -> list[tuple[PodFacts, ContainerFacts]]:
        return []


@pytest.mark.parametrize(("mode", "target"), [
    *((m, "noderesourcetopologies") for m in ANSWERS if m != "devices"),
    ("hang", "noderesourcetopologies"),
    ("devices", "devices"), ("list", "devices"), ("huge", "devices"), ("deep", "devices"),
])  # fmt: skip
def test_a_hostile_answer_costs_only_its_object(server: str, tmp_path: Path, mode: str, target: str) -> None:
    _Hostile.mode, _Hostile.target = mode, target
    hit, other = (NRT, DEVICE) if target == "noderesourcetopologies" else (DEVICE, NRT)
    kind = "NodeResourceTopology" if hit is NRT else "Device"
    sys_root, proc = tmp_path / "sys", tmp_path / "proc"
    write_topology(sys_root, DUAL_SOCKET_HT)
    add_nvidia_gpu(sys_root, proc, "0000:3b:00.0", minor=0, uuid="GPU-a")
    rep = Reporter(ReportConfig(enable=True, sysRoot=str(sys_root), procRoot=str(proc), kubeletConfigFile=""),
                   _Backend(), node_name=NODE, topology=DUAL_SOCKET_HT, cgroups=Cgroups(str(tmp_path / "cg")),
                   objects=_objects(server))  # fmt: skip
    errors = WRITES.labels(kind, "error")._value.get()
    rep.topology_round()
    assert WRITES.labels(kind, "error")._value.get() == errors + 1
    assert other.path(NODE) in _Hostile.stored, "the other object is still written in the same round"
    assert hit.path(NODE) not in _Hostile.stored, "nothing is written over what could not be read"


@pytest.mark.parametrize("mode", ["garbage", "huge", "deep", "digits", "list", "error-body"])
def test_the_writer_refuses_unparsed(server: str, mode: str) -> None:
    _Hostile.mode, _Hostile.target = mode, "noderesourcetopologies"
    with pytest.raises(ApiError) as err:
        _objects(server).get(NRT, NODE)
    assert len(str(err.value)) < 1000


# ---- kubelet's config file, read for the CPU manager policy and reserved CPUs -----------------

KUBELET_CONFIGS = [
    ("deep nesting", "cpuManagerPolicy: " + "[" * 50_000),
    ("alias bomb", "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\n"
                   "c: [*b, *b, *b, *b, *b, *b, *b, *b]\ncpuManagerPolicy: static\n"),
    ("an anchor alone", "cpuManagerPolicy: &p static\n"),
    ("huge repetition", "cpuManagerPolicyOptions:\n" + "".join(f"  k{i}: v\n" for i in range(30_000))),
    ("wrong type for the policy", "cpuManagerPolicy: [static]\n"),
    ("wrong type for reserved CPUs", "reservedSystemCPUs: {a: 1}\nkubeReserved: {cpu: [1]}\n"),
    ("huge exponent", "kubeReserved: {cpu: 1e999999999}\n"),
    ("not a map", "- 1\n- 2\n"),
]


@pytest.mark.parametrize(("text",), [(t,) for _, t in KUBELET_CONFIGS], ids=[d for d, _ in KUBELET_CONFIGS])
def test_a_hostile_kubelet_config_gives_kubelet_s_defaults_never_an_exception(tmp_path: Path, text: str) -> None:
    from runtime_proxy.report.sources import KubeletConfig, read_kubelet_config

    path = tmp_path / "kubelet.yaml"
    path.write_text(text)
    config = read_kubelet_config(str(path))
    assert isinstance(config, KubeletConfig)
    assert config.cpu_manager_policy == "none"  # refused (logged once): kubelet's defaults


CPUINFO_ATTACKS = [
    pytest.param(b"model name\t: " + b"A" * 1_000_000, id="a megabyte-long model name without a newline"),
    pytest.param(b"model name\t: Intel\x00Xeon\n", id="a NUL inside the model"),
    pytest.param(b"\xff\xfe" * 100_000, id="200 KB of invalid UTF-8"),
    pytest.param(b"\n" * 500_000 + b"model name\t: late\n", id="the model past the 64 KiB head"),
    pytest.param(b"model name\t: \xe2\x80\xae reversed\n", id="a bidi override in the model"),
    pytest.param(b"model name" + b":" * 100_000 + b"\n", id="a hundred thousand colons"),
]


@pytest.mark.parametrize("cpuinfo", CPUINFO_ATTACKS)
def test_hostile_machine_files_leave_the_basic_info_empty_never_an_exception(tmp_path: Path, cpuinfo: bytes) -> None:
    """cpuinfo, smt/active, no_turbo and cbm_mask with garbage: the CPU basic info reports
    nothing it cannot vouch for, within the bound, and the annotation stays small."""
    from koord_formats.cpunormalization import MAX_BASIC_INFO_CHARS, format_cpu_basic_info, parse_cpu_basic_info
    from runtime_proxy.report.sources import read_cpu_basic_info

    (tmp_path / "cpuinfo").write_bytes(cpuinfo)
    cpu = tmp_path / "devices/system/cpu"
    for rel, data in (("smt/active", b"1" * 100_000), ("intel_pstate/no_turbo", b"\x00"),
                      ("cpufreq/boost", b"2")):
        (cpu / rel).parent.mkdir(parents=True, exist_ok=True)
        (cpu / rel).write_bytes(data)
    (tmp_path / "fs/resctrl/info/L3").mkdir(parents=True)
    (tmp_path / "fs/resctrl/info/L3/cbm_mask").write_bytes(b"f" * 10_000)
    start = time.thread_time()
    info = read_cpu_basic_info(DUAL_SOCKET_HT, tmp_path, tmp_path)
    assert time.thread_time() - start < 1.0
    assert info.cpu_model == "", "none of these names a model that can be vouched for"
    assert info.turbo_enabled is False and info.cat_l3_cbm_mask == ""
    text = format_cpu_basic_info(info)
    assert len(text) <= MAX_BASIC_INFO_CHARS and parse_cpu_basic_info(text) == info
