"""Local hygiene on the node: the systemd unit creates the socket's directory, ``hook-server``
replaces only a stale socket and makes its own with mode 0660 whatever the umask, hook-server
registrations are read only from files root controls and never name the proxy's own sockets,
and ``--metrics-addr :PORT`` binds loopback (``runtime_proxy.commands.hook_server``,
``runtime_proxy.hookclient``, ``runtime_proxy.metrics``, ``packaging/runtime-proxy.service``)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import socket
import stat
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from runtime_proxy import metrics
from runtime_proxy.commands.hook_server import HookServerOptions, prepare_listen_path, serve, write_registration
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.hookclient.registration import MAX_REGISTRATION_BYTES
from runtime_proxy.hookclient.registry import HookServerRegistry

REPO = Path(__file__).resolve().parents[2]
IS_ROOT = os.geteuid() == 0


@pytest.fixture
def short() -> Iterator[Path]:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    path = Path(f"/tmp/rhp-hyg-{os.getpid()}-{os.urandom(3).hex()}")
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    yield path
    for p in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if p.is_dir() and not p.is_symlink():
            p.rmdir()
        else:
            p.unlink()
    path.rmdir()


# ---- the systemd unit -------------------------------------------------------------------------


def test_systemd_unit_creates_the_listen_sockets_directory() -> None:
    unit = (REPO / "packaging" / "runtime-proxy.service").read_text()
    exec_start = " ".join(re.search(r"^ExecStart=(.*?)(?<!\\)$", unit, re.M | re.S).group(1).split("\\\n"))  # type: ignore[union-attr]
    argv = shlex.split(exec_start)
    listen = argv[argv.index("--listen") + 1]
    runtime_dir = re.search(r"^RuntimeDirectory=(\S+)$", unit, re.M)
    assert runtime_dir is not None
    # RuntimeDirectory= is relative to /run, and /var/run is /run.
    assert "/run/" + runtime_dir.group(1) == os.path.dirname(listen).removeprefix("/var")
    assert re.search(r"^RuntimeDirectoryPreserve=(yes|restart)$", unit, re.M)
    assert "--metrics-addr 127.0.0.1:" in exec_start


# ---- hook-server's listen socket -------------------------------------------------------------


async def _serve_until_listening(listen: Path) -> tuple[asyncio.Event, asyncio.Task[None]]:
    opts = HookServerOptions(listen=str(listen), builtins=(), entry_points=False, apply=False)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(opts, stop))
    deadline = asyncio.get_running_loop().time() + 10
    while not (listen.is_socket() and _accepts(listen)):
        assert not task.done(), task.exception()
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.02)
    return stop, task


def _accepts(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()


@pytest.mark.parametrize(
    "umask",
    [
        pytest.param(0o000, id="umask 0 still gives a 0660 socket"),
        pytest.param(0o077, id="umask 077 still gives a 0660 socket"),
    ],
)
async def test_hook_server_socket_mode_is_0660(short: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        stop, task = await _serve_until_listening(short / "h.sock")
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(os.stat(short / "h.sock").st_mode) == 0o660
    finally:
        stop.set()
        await task
    assert not (short / "h.sock").exists()


async def test_hook_server_replaces_a_stale_socket(short: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(short / "h.sock"))
    stale.close()  # the file stays; nobody accepts on it
    stop, task = await _serve_until_listening(short / "h.sock")
    stop.set()
    await task


@pytest.mark.parametrize(
    ("make", "error"),
    [
        pytest.param(lambda p: p.write_text("data"), FileExistsError, id="a regular file is left alone"),
        pytest.param(lambda p: p.mkdir(), FileExistsError, id="a directory is left alone"),
        pytest.param(lambda p: p.symlink_to("/etc/hostname"), FileExistsError, id="a symlink is left alone"),
    ],
)
def test_prepare_listen_path_refuses_what_is_not_a_socket(
    short: Path, make: Callable[[Path], object], error: type[Exception]
) -> None:
    target = short / "h.sock"
    make(target)
    before = os.lstat(target)
    with pytest.raises(error):
        prepare_listen_path(str(target))
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)


def test_prepare_listen_path_refuses_a_live_socket(short: Path) -> None:
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(short / "h.sock"))
    live.listen()
    try:
        with pytest.raises(OSError, match="another process serves this socket"):
            prepare_listen_path(str(short / "h.sock"))
        assert _accepts(short / "h.sock")
    finally:
        live.close()


def test_written_registration_is_safe_under_umask_0(short: Path) -> None:
    old = os.umask(0)
    try:
        path = write_registration(str(short / "reg.d"), "ours", {"remote-endpoint": "/run/x.sock"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(short / "reg.d").st_mode) == 0o755


# ---- registrations ------------------------------------------------------------------------------


def _doc(endpoint: str) -> str:
    return json.dumps({"remote-endpoint": endpoint, "failure-policy": "Fail", "runtime-hooks": ["PreCreateContainer"]})


def _refused(reason: str) -> float:
    value = metrics.REGISTRATIONS_REFUSED.labels(reason)._value.get()
    return float(value)


def _write(d: Path, name: str, text: str, mode: int = 0o644) -> Path:
    path = d / name
    path.write_text(text)
    os.chmod(path, mode)
    return path


OWN_BACKEND = "/run/containerd/containerd.sock"


def _symlinked_file(d: Path) -> None:
    target = _write(d.parent, "elsewhere.json", _doc("/run/evil.sock"))
    (d / "bad.json").symlink_to(target)


def _own_backend_by_another_path(d: Path) -> None:
    # The proxy's own listen socket, named through a symlinked directory.
    (d.parent / "alias").symlink_to(d.parent / "sockets")
    _write(d, "bad.json", _doc(str(d.parent / "alias" / "proxy.sock")))


def _chown_nobody(d: Path) -> None:
    path = _write(d, "bad.json", _doc("/run/evil.sock"))
    os.chown(path, 65534, 65534)


BAD_FILES = [
    pytest.param(lambda d: _write(d, "bad.json", _doc("/run/evil.sock"), 0o666), "writable",
                 id="a world-writable file is refused"),
    pytest.param(lambda d: _write(d, "bad.json", _doc("/run/evil.sock"), 0o664), "writable",
                 id="a group-writable file is refused"),
    pytest.param(_symlinked_file, "symlink", id="a symlink to a registration elsewhere is refused"),
    pytest.param(lambda d: (d / "bad.json").mkdir(), "not-regular-file", id="a directory named like a file"),
    pytest.param(lambda d: _write(d, "bad.json", _doc(OWN_BACKEND)), "own-socket",
                 id="a registration naming containerd's socket, the proxy's backend, is refused"),
    pytest.param(lambda d: _write(d, "bad.json", _doc("unix://" + OWN_BACKEND)), "own-socket",
                 id="the backend named with a unix scheme is refused as well"),
    pytest.param(_own_backend_by_another_path, "own-socket",
                 id="the proxy's listen socket named through a symlinked directory is refused"),
    pytest.param(lambda d: _write(d, "bad.json", " " * (MAX_REGISTRATION_BYTES + 1)), "too-large",
                 id="an oversized file is refused unread"),
    pytest.param(lambda d: _write(d, "bad.json", "[" * 30_000), "malformed",
                 id="deeply nested JSON is malformed, not a crash"),
    pytest.param(_chown_nobody, "owner", marks=pytest.mark.requires_root,
                 id="a file owned by another user is refused"),
]


@pytest.fixture
async def registry_dir(short: Path) -> AsyncIterator[tuple[Path, HookServerRegistry, Pipeline]]:
    regdir = short / "hookserver.d"
    regdir.mkdir(mode=0o755)
    (short / "sockets").mkdir()
    (short / "sockets" / "proxy.sock").touch()
    pipeline = Pipeline()
    registry = HookServerRegistry(regdir, pipeline, poll_interval=10,
                                  own_sockets=(f"unix://{OWN_BACKEND}", str(short / "sockets" / "proxy.sock")))
    yield regdir, registry, pipeline
    await registry.stop()


@pytest.mark.parametrize(("make", "reason"), BAD_FILES)
async def test_unsafe_registration_is_refused_and_counted(
    registry_dir: tuple[Path, HookServerRegistry, Pipeline], make: Callable[[Path], object], reason: str
) -> None:
    regdir, registry, pipeline = registry_dir
    _write(regdir, "good.json", _doc("/run/good.sock"))
    make(regdir)
    before = _refused(reason)
    await registry.start()
    assert [s.name for s in pipeline.steps] == ["hookserver:good.json"]
    assert "bad.json" in registry.errors
    assert _refused(reason) == before + 1
    await registry.refresh()  # the same version of the file is not logged or counted again
    assert _refused(reason) == before + 1


def _world_writable_dir(d: Path) -> None:
    os.chmod(d, 0o777)


def _dir_owned_by_nobody(d: Path) -> None:
    os.chown(d, 65534, 65534)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_world_writable_dir, id="a world-writable directory drops every registration"),
        pytest.param(lambda d: os.chmod(d, 0o775), id="a group-writable directory drops every registration"),
        pytest.param(_dir_owned_by_nobody, marks=pytest.mark.requires_root,
                     id="a directory owned by another user drops every registration"),
    ],
)
async def test_unsafe_directory_drops_every_registration_until_fixed(
    registry_dir: tuple[Path, HookServerRegistry, Pipeline], make: Callable[[Path], object]
) -> None:
    regdir, registry, pipeline = registry_dir
    _write(regdir, "good.json", _doc("/run/good.sock"))
    await registry.start()
    assert len(pipeline.steps) == 1
    before = _refused("unsafe-directory")
    make(regdir)
    await registry.refresh()
    assert pipeline.steps == []
    assert _refused("unsafe-directory") == before + 1
    await registry.refresh()
    assert _refused("unsafe-directory") == before + 1
    os.chown(regdir, os.geteuid(), os.getegid())
    os.chmod(regdir, 0o755)
    await registry.refresh()
    assert [s.name for s in pipeline.steps] == ["hookserver:good.json"]


async def test_symlinked_directory_is_refused(short: Path) -> None:
    real = short / "real.d"
    real.mkdir(mode=0o755)
    _write(real, "good.json", _doc("/run/good.sock"))
    (short / "hookserver.d").symlink_to(real)
    pipeline = Pipeline()
    registry = HookServerRegistry(short / "hookserver.d", pipeline, poll_interval=10)
    before = _refused("unsafe-directory")
    await registry.start()
    try:
        assert pipeline.steps == []
        assert _refused("unsafe-directory") == before + 1
    finally:
        await registry.stop()


async def test_a_fixed_file_is_read_again(registry_dir: tuple[Path, HookServerRegistry, Pipeline]) -> None:
    regdir, registry, pipeline = registry_dir
    bad = _write(regdir, "x.json", _doc("/run/good.sock"), 0o666)
    await registry.start()
    assert pipeline.steps == []
    os.chmod(bad, 0o644)  # a mode change alone (same content, same mtime) is noticed
    await registry.refresh()
    assert [s.name for s in pipeline.steps] == ["hookserver:x.json"]


# ---- the metrics address ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        pytest.param(":9464", ("127.0.0.1", 9464), id="no host means loopback, not every interface"),
        pytest.param("127.0.0.1:9464", ("127.0.0.1", 9464), id="an explicit IPv4 host is kept"),
        pytest.param("0.0.0.0:9464", ("0.0.0.0", 9464), id="every interface only when asked for"),
        pytest.param("[::1]:9464", ("::1", 9464), id="a bracketed IPv6 host loses its brackets"),
        pytest.param("node.local:80", ("node.local", 80), id="a host name is kept"),
    ],
)
def test_metrics_address(addr: str, expected: tuple[str, int]) -> None:
    assert metrics.parse_addr(addr) == expected


@pytest.mark.parametrize(
    "addr",
    [
        pytest.param("9464", id="a bare port is refused"),
        pytest.param(":", id="no port at all"),
        pytest.param(":0", id="port zero"),
        pytest.param(":65536", id="a port past 65535"),
        pytest.param(":" + "\uff19\uff14\uff16\uff14", id="non-ASCII digits"),
        pytest.param("host:http", id="a service name"),
    ],
)
def test_bad_metrics_address(addr: str) -> None:
    with pytest.raises(ValueError):
        metrics.parse_addr(addr)


def test_metrics_port_without_host_listens_on_loopback_only() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    server = metrics.serve(f":{port}")
    try:
        assert server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert b"rhp_hookserver_registrations_refused_total" in resp.read()
    finally:
        server.shutdown()
        server.server_close()


async def test_the_proxy_refuses_registrations_naming_its_own_sockets(short: Path) -> None:
    from runtime_proxy.commands.serve import Proxy, ProxyOptions
    from runtime_proxy.config import ProxyConfig

    regdir = short / "hookserver.d"
    regdir.mkdir(mode=0o755)
    backend, listen = short / "containerd.sock", short / "proxy.sock"
    _write(regdir, "backend.json", _doc(f"unix://{backend}"))
    _write(regdir, "listen.json", _doc(str(listen)))
    _write(regdir, "good.json", _doc(str(short / "good.sock")))
    opts = ProxyOptions(listen=str(listen), backend=str(backend), entry_points=False, builtins=(),
                        config=ProxyConfig(hookServerDir=str(regdir)), reconcile=False)
    proxy = Proxy(opts)
    registry = await proxy._start_hook_servers()
    try:
        assert [s.name for s in proxy.pipeline.steps if s.name.startswith("hookserver:")] == ["hookserver:good.json"]
        assert sorted(registry.errors) == ["backend.json", "listen.json"]
    finally:
        await registry.stop()
        await proxy.client.close()
