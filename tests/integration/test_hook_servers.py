"""Hook servers on real containerd: our proxy calling our hook server over RuntimeHookService
gives the same cgroups as the same plugin in process; faulty servers under Fail and Ignore;
registrations added, changed, removed and malformed while the proxy runs; two servers on one
hook point, in file-name order, merged by Koordinator's rules.

Transports: the equivalence and fault tests run on every transport in ``RHP_TRANSPORTS`` (the
rejection must cross the transport); the reload and merge tests use the first one only, since
registrations and merging live in the pipeline, not in the transport.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from rhp_devenv.cgroupfs import read_cgroup_file
from rhp_devenv.cri import linux_resources

from cri_protos import api_pb2
from cri_protos import hookserver_pb2_grpc as pb_grpc
from runtime_proxy.commands.serve import ProxyOptions
from runtime_proxy.config import ProxyConfig
from runtime_proxy.hookclient.registry import HookServerRegistry
from tests.hook_replies import echo_reply
from tests.integration import plugins_for_tests as tp
from tests.integration.harness import REPO, ProxyThread, proxy_options

pytestmark = pytest.mark.integration

TRANSPORTS = os.environ.get("RHP_TRANSPORTS", "relay,grpc").split(",")


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def sockdir() -> Iterator[Path]:
    """A short directory for sockets (unix socket paths are limited to 108 bytes)."""
    path = Path(f"/tmp/rhp-hsi-{uuid.uuid4().hex[:8]}")
    path.mkdir()
    yield path
    for p in path.iterdir():
        p.unlink()
    path.rmdir()


def _wait_for(cond: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not cond():
        if time.monotonic() - started > timeout:
            raise TimeoutError(what)
        time.sleep(0.02)
    return time.monotonic() - started


def _child(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - handed to the child
    return subprocess.Popen([sys.executable, *args], env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=out, stderr=out)


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def our_hook_server(sockdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``runtime-proxy hook-server`` serving the test PinPlugin; yields its registration dir."""
    regdir = tmp_path_factory.mktemp("ours-hookserver.d")
    proc = _child(["-m", "runtime_proxy.cli", "--log-format", "json", "hook-server",
                   "--listen", str(sockdir / "ours.sock"), "--register-dir", str(regdir), "--register-name", "ours",
                   "--failure-policy", "Fail", "--builtins", "", "--no-entry-points", "--no-apply",
                   "--plugin-module", "tests.integration.plugins_for_tests:PinPlugin"],
                  regdir.parent / "ours.log")
    try:
        _wait_for(lambda: (regdir / "ours.json").exists() or proc.poll() is not None, 20, "hook server start")
        assert proc.poll() is None, (regdir.parent / "ours.log").read_text()
        yield regdir
    finally:
        _end(proc)
    assert not (regdir / "ours.json").exists()  # a clean exit removes the registration


@pytest.fixture(scope="module")
def example_server(sockdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``examples/hook_server/label_hook_server.py``, as a user would run it; yields its socket."""
    sock = sockdir / "example.sock"
    log = tmp_path_factory.mktemp("example") / "example.log"
    proc = _child([str(REPO / "examples/hook_server/label_hook_server.py"), "--listen", str(sock)], log)
    try:
        _wait_for(lambda: sock.exists() or proc.poll() is not None, 20, "example server start")
        assert proc.poll() is None, log.read_text()
        yield sock
    finally:
        _end(proc)


class Fake(pb_grpc.RuntimeHookServiceServicer):  # type: ignore[misc]
    """A scripted hook server (sync gRPC in threads): ``behaviour(request, context)`` answers."""

    def __init__(self, name: str, behaviour: Callable[[Any, Any], Any], journal: list[tuple[str, Any]]) -> None:
        self.name = name
        self.behaviour = behaviour
        self.journal = journal

    def PreCreateContainerHook(self, request: Any, context: Any) -> Any:
        self.journal.append((self.name, request))
        return self.behaviour(request, context)


class Fakes:
    """Starts fake servers on sockets; stops them all at the end."""

    def __init__(self, sockdir: Path) -> None:
        self.sockdir = sockdir
        self.servers: list[grpc.Server] = []
        self.journal: list[tuple[str, Any]] = []
        self.release = threading.Event()

    def start(self, name: str, behaviour: Callable[[Any, Any], Any]) -> Path:
        sock = self.sockdir / f"{name}-{uuid.uuid4().hex[:6]}.sock"
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RuntimeHookServiceServicer_to_server(Fake(name, behaviour, self.journal), server)
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        self.servers.append(server)
        return sock

    def stop(self) -> None:
        self.release.set()
        for s in self.servers:
            s.stop(0)


@pytest.fixture
def fakes(sockdir: Path) -> Iterator[Fakes]:
    f = Fakes(sockdir)
    yield f
    f.stop()


_opts = proxy_options


def _remote(containerd: Any, tmp_path: Path, transport: str, regdir: Path, timeout: float = 2.0) -> ProxyOptions:
    cfg = ProxyConfig(hookServerDir=str(regdir), hookServerTimeout=timeout)
    return _opts(containerd, tmp_path, transport, hook_servers=True, config=cfg)


def _registry(p: ProxyThread) -> HookServerRegistry:
    assert p.proxy is not None and isinstance(p.proxy.hook_servers, HookServerRegistry)
    return p.proxy.hook_servers


def _register(regdir: Path, name: str, endpoint: Path | str, policy: str = "Ignore", **extra: Any) -> None:
    doc = {"remote-endpoint": str(endpoint), "failure-policy": policy, "runtime-hooks": ["PreCreateContainer"],
           **extra}
    tmp = regdir / f".{name}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, regdir / name)


def _pin_sequence(p: ProxyThread, containerd: Any, cri_client: Any) -> dict[str, str]:
    client = cri_client(p.opts.listen)
    parent = containerd.new_cgroup_parent()
    pod = client.run_pod(cgroup_parent=parent, labels={"test": "pin"})
    cid = client.run_container(pod, resources=linux_resources(cpu_shares=256, cpu_quota=50000))
    seen = {
        "create cpuset": read_cgroup_file(parent, cid, "cpuset", "cpuset.cpus"),
        "create shares": read_cgroup_file(parent, cid, "cpu", "cpu.shares"),
        "create quota": read_cgroup_file(parent, cid, "cpu", "cpu.cfs_quota_us"),
    }
    client.update_container_resources(cid, linux_resources(cpu_shares=300, cpu_quota=60000))
    seen["update shares"] = read_cgroup_file(parent, cid, "cpu", "cpu.shares")
    seen["update quota"] = read_cgroup_file(parent, cid, "cpu", "cpu.cfs_quota_us")
    seen["update cpuset"] = read_cgroup_file(parent, cid, "cpuset", "cpuset.cpus")
    return seen


def test_remote_plugin_gives_same_cgroups_as_in_process(
    containerd: Any, tmp_path: Path, cri_client: Any, transport: str, our_hook_server: Path
) -> None:
    with ProxyThread(_opts(containerd, tmp_path, transport, extra_plugins=(tp.PinPlugin(),))) as p:
        in_process = _pin_sequence(p, containerd, cri_client)
    with ProxyThread(_remote(containerd, tmp_path, transport, our_hook_server)) as p:
        assert [s.name for s in _registry(p).steps] == ["hookserver:ours.json"]
        remote = _pin_sequence(p, containerd, cri_client)
    assert remote == in_process
    assert remote == {"create cpuset": "0", "create shares": "777", "create quota": "50000",
                      "update shares": "555", "update quota": "60000", "update cpuset": "0"}


def _outcome(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as err:
        return err.code(), err.details()
    return grpc.StatusCode.OK, ""


def test_faulty_hook_servers_under_policy(
    containerd: Any, tmp_path: Path, cri_client: Any, transport: str, sockdir: Path, fakes: Fakes
) -> None:
    def hang(request: Any, context: Any) -> Any:
        fakes.release.wait(10)
        return echo_reply(request)

    def error(request: Any, context: Any) -> Any:
        context.abort(grpc.StatusCode.INTERNAL, "boom from fake hook server")

    endpoints = {
        "down": sockdir / "nobody-listens.sock",
        "hangs": fakes.start("hangs", hang),
        "errors": fakes.start("errors", error),
    }
    regdir = tmp_path / "hookserver.d"
    regdir.mkdir()
    with ProxyThread(_remote(containerd, tmp_path, transport, regdir)) as p:
        registry = _registry(p)
        client = cri_client(p.opts.listen)
        pod = client.run_pod(cgroup_parent=containerd.new_cgroup_parent())
        for fault, endpoint in endpoints.items():
            for policy in ("Fail", "Ignore"):
                _register(regdir, "fault.json", endpoint, policy, **{"timeout-seconds": 0.5})
                wanted = [(str(endpoint), policy)]

                def registered(wanted: list[tuple[str, str]] = wanted) -> bool:
                    return [(s.registration.endpoint, s.policy) for s in registry.steps] == wanted

                _wait_for(registered, 2, f"registration {fault}/{policy}")
                started = time.monotonic()
                before = {c.id for c in client.list_containers(pod_id=pod.pod_id)}
                code, details = _outcome(lambda: client.run_container(pod))
                case = f"{fault} under {policy}: {code} {details}"
                assert time.monotonic() - started < 5, case
                if policy == "Fail":
                    assert code == grpc.StatusCode.FAILED_PRECONDITION, case
                    assert "hookserver:fault.json" in details and "policy Fail" in details, case
                    assert str(endpoint) in details, case
                    # Nothing was created behind kubelet's back.
                    assert {c.id for c in client.list_containers(pod_id=pod.pod_id)} == before, case
                else:
                    assert code == grpc.StatusCode.OK, case
                    cid = pod.container_ids[-1]
                    assert client.container_status(cid).state == api_pb2.CONTAINER_RUNNING, case
                # The proxy keeps serving.
                assert client.version().runtime_name


def test_registrations_reload_while_running(
    containerd: Any, tmp_path: Path, cri_client: Any, fakes: Fakes
) -> None:
    first = fakes.start("first", lambda r, c: echo_reply(r, shares=600))
    second = fakes.start("second", lambda r, c: echo_reply(r, shares=700))
    regdir = tmp_path / "hookserver.d"
    regdir.mkdir()
    (regdir / "00-bad.json").write_text('{"remote-endpoint": 5, "runtime-hooks": "PreCreateContainer"')
    with ProxyThread(_remote(containerd, tmp_path, TRANSPORTS[0], regdir)) as p:
        registry = _registry(p)
        client = cri_client(p.opts.listen)
        parent = containerd.new_cgroup_parent()
        pod = client.run_pod(cgroup_parent=parent)

        def shares() -> str:
            cid = client.run_container(pod, resources=linux_resources(cpu_shares=256))
            return read_cgroup_file(parent, cid, "cpu", "cpu.shares")

        assert "00-bad.json" in registry.errors and registry.steps == []
        assert shares() == "256"

        def endpoints() -> list[str]:
            return [s.registration.endpoint for s in registry.steps]

        _register(regdir, "50-s.json", first)
        assert _wait_for(lambda: endpoints() == [str(first)], 2, "added") < 2
        assert shares() == "600"
        _register(regdir, "50-s.json", second)
        assert _wait_for(lambda: endpoints() == [str(second)], 2, "changed") < 2
        assert shares() == "700"
        (regdir / "50-s.json").unlink()
        assert _wait_for(lambda: endpoints() == [], 2, "removed") < 2
        assert shares() == "256"
        # The malformed file stayed skipped all along, without disturbing the others.
        assert "00-bad.json" in registry.errors
    assert [name for name, _ in fakes.journal] == ["first", "second"]


def test_two_servers_run_in_order_and_merge(
    containerd: Any, tmp_path: Path, cri_client: Any, fakes: Fakes, example_server: Path
) -> None:
    a = fakes.start("a", lambda r, c: echo_reply(r, cpuset="0", ann={"example.com/a": "1"}))
    b = fakes.start("b", lambda r, c: echo_reply(r, shares=600, ann={"example.com/b": "2"}))
    regdir = tmp_path / "hookserver.d"
    regdir.mkdir()
    # Written in reverse so that file-name order, not creation order, decides.
    _register(regdir, "30-example.json", example_server)
    _register(regdir, "20-b.json", b)
    _register(regdir, "10-a.json", a)
    with ProxyThread(_remote(containerd, tmp_path, TRANSPORTS[0], regdir)) as p:
        assert [s.name for s in _registry(p).steps] == [
            "hookserver:10-a.json", "hookserver:20-b.json", "hookserver:30-example.json"]
        client = cri_client(p.opts.listen)
        parent = containerd.new_cgroup_parent()
        pod = client.run_pod(cgroup_parent=parent, labels={"example.com/hello": "world"})
        cid = client.run_container(pod, resources=linux_resources(cpu_shares=256, cpuset_cpus="0-1"))
        assert [name for name, _ in fakes.journal] == ["a", "b"]
        # b saw the request as a changed it.
        seen_by_b = fakes.journal[1][1]
        assert seen_by_b.container_resources.cpuset_cpus == "0"
        assert seen_by_b.container_annotations["example.com/a"] == "1"
        assert read_cgroup_file(parent, cid, "cpuset", "cpuset.cpus") == "0"
        assert read_cgroup_file(parent, cid, "cpu", "cpu.shares") == "600"
        annotations = client.container_status(cid).annotations
        assert annotations["example.com/a"] == "1"
        assert annotations["example.com/b"] == "2"
        assert annotations["example.com/greeted"] == "world"
