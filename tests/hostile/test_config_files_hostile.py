"""Hostile files at every configuration path each command reads: a FIFO, a unix socket, a
character device (a symlink to ``/dev/zero``), a directory, a symlink to a FIFO and a 5 GiB
sparse file (``tests/hostile_files.py``). Every read goes through ``rhp_ops.files``, so each
command answers at once with one clear line, and a running daemon keeps serving.

- One-shot answers (``serve``, ``nri`` and ``hook-server`` refusing to start, ``plan``,
  ``doctor``, ``kubelet-switch``, ``scheduler-ext serve``) run in-process, each in a thread
  with a hang guard far above what an answer takes (the time is not asserted: the machine may
  be loaded); a command that blocks on a FIFO is released by opening the FIFO for writing, and
  the case fails. Exit codes: 2 for a bad config or kubelet file (``rhp_ops.cli``, each
  command's epilog); ``doctor`` reports a bad file as a failed check (exit 1), and so does
  ``kubelet-switch --config``, whose doctor run then refuses the switch.
- The daemons (``serve`` and ``nri`` as real processes) get their node config file replaced by
  each kind in turn while they run: each is refused (logged with its reason), a CRI or NRI call
  is still answered after each, a valid file is taken again, and SIGTERM stops the process.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from rhp_devenv.kube import free_port as _free_port

from cri_protos import nri_pb2
from rhp_ops.files import MAX_KUBECONFIG_BYTES, FileRefused
from tests.hostile_files import KINDS, plant, release_fifo_readers
from tests.integration.harness import REPO, ProxyProcess
from tests.runtime_proxy.nri.fake_runtime import FakeRuntime

HANG_GUARD = 30.0  # seconds; an answer takes milliseconds, a hang takes forever
CONFIG = "defaultPolicy: Ignore\n"
NODE_CONFIG = "name: n1\nlabels: {zone: a}\n"
KUBELET_CONFIG = "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n"
FLAGS = "KUBELET_KUBEADM_ARGS=--container-runtime-endpoint=unix:///run/containerd/containerd.sock\n"
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

# What each kind is called in the one-line error (rhp_ops.files.FileRefused's message).
SAYS = {
    "fifo": "not a regular file: a FIFO",
    "socket": "not a regular file: a socket",
    "device": "not a regular file: a character device",
    "directory": "not a regular file: a directory",
    "symlink-to-fifo": "not a regular file: a FIFO",
    "sparse-5g": "larger than",
}
# Hook-server registrations are read without following symlinks (runtime_proxy/hookclient/).
SAYS_NO_FOLLOW = {**SAYS, "device": "a symlink", "symlink-to-fifo": "a symlink"}


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The commands configure structlog for the process; give the next test the defaults back."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def work() -> Iterator[Path]:
    """A scratch directory with a path short enough for unix sockets, holding a valid file for
    every configuration path; a case then plants its hostile file over one of them."""
    path = Path(f"/tmp/rhp-cfg-{os.getpid()}-{os.urandom(3).hex()}")
    path.mkdir()
    (path / "config.yaml").write_text(CONFIG)
    (path / "node.yaml").write_text(NODE_CONFIG)
    (path / "kubelet.yaml").write_text(KUBELET_CONFIG)
    (path / "flags.env").write_text(FLAGS)
    (path / "hs").mkdir(mode=0o755)
    for name in ("tls.crt", "tls.key", "ca.crt", "kubeconfig"):
        (path / name).write_text(PEM)
    (path / "cg" / "cpu").mkdir(parents=True)
    try:
        yield path
    finally:
        release_fifo_readers(path)
        shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Case:
    """One command and one configuration path it reads: the flags (``argv(work)``), the file
    the hostile thing replaces, the exit code and what the answer says (``says`` by kind)."""

    command: str  # "runtime-proxy" or "scheduler-ext"
    argv: Callable[[Path], list[str]]
    path: str
    code: int
    says: dict[str, str]
    stream: str = "err"  # where the answer is: stderr, or stdout for doctor's report


def _rp(*argv: str) -> Callable[[Path], list[str]]:
    return lambda d: [a.replace("@", str(d)) for a in argv]


_SERVE = ("serve", "--listen", "@/p.sock", "--backend", "@/none.sock", "--hook-server-dir", "@/hs",
          "--no-entry-points")
_NRI = ("nri", "--nri-socket", "@/nri.sock", "--hook-server-dir", "@/hs", "--no-entry-points",
        "--cgroup-root", "@/cg")
_HOOK_SERVER = ("hook-server", "--listen", "@/h.sock", "--no-entry-points", "--cgroup-root", "@/cg")
_DOCTOR = ("doctor", "--cgroup-root", "@/cg", "--resctrl-root", "@/rc", "--proc-root", "@/proc", "--plugins", "",
           "--skip", "runtime", "--skip", "nri", "--listen", "@/p.sock")
_KUBELET = ("kubelet-switch", "--kubelet-config", "@/kubelet.yaml", "--flags-file", "@/flags.env",
            "--no-restart", "--readyz", "http://127.0.0.1:9/readyz", "--cgroup-root", "@/cg",
            "--resctrl-root", "@/rc", "--plugins", "", "--skip", "runtime", "--skip", "nri", "--skip", "listen")
_SCHED = ("serve", "--listen", "127.0.0.1:0", "--no-ha-ledger")

CASES = {
    "serve --config": Case("runtime-proxy", _rp(*_SERVE, "--config", "@/config.yaml"), "config.yaml", 2, SAYS),
    "serve --node-config": Case("runtime-proxy", _rp(*_SERVE, "--node-config", "@/node.yaml"), "node.yaml", 2, SAYS),
    "serve nodeConfigFile": Case("runtime-proxy", _rp(*_SERVE, "--config", "@/with-node.yaml"), "node.yaml", 2,
                                 SAYS),
    "nri --config": Case("runtime-proxy", _rp(*_NRI, "--config", "@/config.yaml"), "config.yaml", 2, SAYS),
    "nri --node-config": Case("runtime-proxy", _rp(*_NRI, "--node-config", "@/node.yaml"), "node.yaml", 2, SAYS),
    "hook-server --config": Case("runtime-proxy", _rp(*_HOOK_SERVER, "--config", "@/config.yaml"), "config.yaml", 2,
                                 SAYS),
    "hook-server --node-config": Case("runtime-proxy", _rp(*_HOOK_SERVER, "--node-config", "@/node.yaml"),
                                      "node.yaml", 2, SAYS),
    "plan --config": Case("runtime-proxy", _rp("plan", "--config", "@/config.yaml", "@/none.json"), "config.yaml", 2,
                          SAYS),
    "doctor --config": Case("runtime-proxy", _rp(*_DOCTOR, "--config", "@/config.yaml"), "config.yaml", 1, SAYS,
                            "out"),
    "doctor --node-config": Case("runtime-proxy", _rp(*_DOCTOR, "--node-config", "@/node.yaml"), "node.yaml", 1,
                                 SAYS, "out"),
    "doctor --hook-server-dir": Case("runtime-proxy", _rp(*_DOCTOR, "--hook-server-dir", "@/hs"), "hs/a.json", 1,
                                     SAYS_NO_FOLLOW, "out"),
    "kubelet-switch --kubelet-config": Case("runtime-proxy", _rp(*_KUBELET, "--to", "proxy"), "kubelet.yaml", 2,
                                            SAYS),
    "kubelet-switch --flags-file": Case("runtime-proxy", _rp(*_KUBELET, "--to", "proxy"), "flags.env", 2, SAYS),
    "kubelet-switch rollback backup": Case("runtime-proxy", _rp(*_KUBELET, "--to", "containerd"),
                                           "kubelet.yaml.rhp-backup", 2, SAYS),
    "kubelet-switch --config": Case("runtime-proxy", _rp(*_KUBELET, "--to", "proxy", "--config", "@/config.yaml"),
                                    "config.yaml", 1, SAYS, "out"),
    "scheduler-ext --kubeconfig": Case("scheduler-ext", _rp(*_SCHED, "--kubeconfig", "@/kubeconfig"), "kubeconfig",
                                       2, SAYS),
    "scheduler-ext --tls-cert": Case("scheduler-ext", _rp(*_SCHED, "--tls-cert", "@/tls.crt", "--tls-key",
                                                          "@/tls.key", "--kubeconfig", "@/kubeconfig"),
                                     "tls.crt", 2, SAYS),
    "scheduler-ext --tls-key": Case("scheduler-ext", _rp(*_SCHED, "--tls-cert", "@/tls.crt", "--tls-key", "@/tls.key",
                                                         "--kubeconfig", "@/kubeconfig"),
                                    "tls.key", 2, SAYS),
    "scheduler-ext --tls-client-ca": Case("scheduler-ext", _rp(*_SCHED, "--tls-cert", "@/tls.crt", "--tls-key",
                                                               "@/tls.key", "--tls-client-ca", "@/ca.crt",
                                                               "--kubeconfig", "@/kubeconfig"),
                                          "ca.crt", 2, SAYS),
}


def _main(command: str) -> Callable[[list[str]], int]:
    if command == "scheduler-ext":
        from scheduler_ext.cli import main as sched_main

        return sched_main
    from runtime_proxy.cli import main as proxy_main

    return proxy_main


def _answer(command: str, argv: list[str], work: Path) -> tuple[int | None, float]:
    """Run the command in a thread; (exit code, seconds), or (None, ...) when it hung (the
    FIFOs under ``work`` are then opened for writing so that the thread can end)."""
    result: list[int] = []

    def run() -> None:
        try:
            result.append(_main(command)(argv))
        except SystemExit as exc:
            result.append(int(exc.code or 0))
        except BaseException:  # a traceback: the case fails on the exit code (-1) and the output
            traceback.print_exc()
            result.append(-1)

    thread = threading.Thread(target=run, daemon=True, name="command-under-test")
    started = time.monotonic()
    thread.start()
    thread.join(HANG_GUARD)
    took = time.monotonic() - started
    if thread.is_alive():
        release_fifo_readers(work)
        thread.join(5)
        return None, took
    return result[0], took


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", list(CASES))
def test_each_command_answers_with_a_clear_error(work: Path, name: str, kind: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES[name]
    (work / "with-node.yaml").write_text(f"nodeConfigFile: {work / 'node.yaml'}\n")
    (work / "kubelet.yaml.rhp-backup").write_text(KUBELET_CONFIG)
    (work / "hs" / "a.json").write_text("{}")
    os.chmod(work / "hs" / "a.json", 0o644)
    target = work / case.path
    plant(kind, target)
    code, _took = _answer(case.command, case.argv(work), work)
    out, err = capsys.readouterr()
    assert code is not None, f"{name} did not answer with a {kind} at {target}"
    answer = out if case.stream == "out" else err
    assert code == case.code, (out, err)
    assert case.says[kind] in answer, answer
    assert "Traceback" not in out + err
    if case.stream == "err":
        assert len(err.strip().splitlines()) == 1, err
    if name.startswith("kubelet-switch"):  # nothing changed
        for file, text in (("kubelet.yaml", KUBELET_CONFIG), ("flags.env", FLAGS)):
            assert file == case.path or (work / file).read_text() == text
        assert not (work / "flags.env.rhp-backup").exists()


def _outcome(call: Callable[[], object], work: Path) -> BaseException | None:
    """What ``call`` raised (None: it returned), failing the test when it does not end within
    the hang guard (the FIFOs under ``work`` are then released)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True, name="reader-under-test")
    thread.start()
    thread.join(HANG_GUARD)
    if thread.is_alive():
        release_fifo_readers(work)
        thread.join(5)
        pytest.fail("did not return")
    return outcome[0]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reader", ["evictions (KUBECONFIG)", "fromCluster (kubeconfig)"])
def test_the_daemons_kubeconfig_is_refused_without_blocking(work: Path, reader: str, kind: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``usageLoop.evictBy: api`` and ``fromCluster`` load a kubeconfig in a worker thread; a FIFO
    there held that thread (and every later eviction or watch) for good."""
    from runtime_proxy.loops.evict import _load_api_client
    from runtime_proxy.state.nodeconfig import ClusterWatch

    path = work / "kubeconfig"
    plant(kind, path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(path))
    call = _load_api_client if reader.startswith("evictions") else ClusterWatch("n1", kubeconfig=str(path))._http
    error = _outcome(call, work)
    assert isinstance(error, FileRefused), error
    assert str(error) == f"kubeconfig {path}: " + (f"larger than {MAX_KUBECONFIG_BYTES} bytes"
                                                   if kind == "sparse-5g" else SAYS[kind])


# ---- the daemons -------------------------------------------------------------------------------


class _AnyMethod(grpc.GenericRpcHandler):
    """A CRI backend that answers every unary call with an empty message (a valid reply of any
    CRI method: empty lists, an empty VersionResponse)."""

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(lambda request, context: b"")


@pytest.fixture
def backend(work: Path) -> Iterator[Path]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((_AnyMethod(),))
    server.add_insecure_port(f"unix:{work / 'crio.sock'}")
    server.start()
    try:
        yield work / "crio.sock"
    finally:
        server.stop(0)


def _rejected(port: int) -> dict[str, float]:
    """``rhp_node_config_rejected_total{source="file"}`` by reason, from the daemon's /metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.fullmatch(r'rhp_node_config_rejected_total\{(.*)\} (\S+)', line)
        if m and 'source="file"' in m.group(1):
            reason = re.search(r'reason="([^"]*)"', m.group(1))
            out[reason.group(1) if reason else ""] = float(m.group(2))
    return out


def _changes(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    m = re.search(r'^rhp_node_config_reloads_total\{source="file"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _wait_for(what: str, check: Callable[[], bool], log: Path, timeout: float = HANG_GUARD) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}; the log ends:\n"
                                 + log.read_text(errors="replace")[-3000:])
        time.sleep(0.05)


def _swap_every_kind(work: Path, port: int, log: Path, still_serving: Callable[[], None]) -> None:
    """Replace the node config file by each kind in turn; each must be refused (counted in
    ``rhp_node_config_rejected_total`` with its reason; the log line of a repeated refusal may
    be folded by ``rhp_ops.logs.RepeatLimiter``) while ``still_serving`` succeeds; then a valid
    file is taken again."""
    node = work / "node.yaml"
    for i, kind in enumerate(KINDS, start=1):
        plant(kind, node)
        _wait_for(f"the {kind} to be refused", lambda i=i: sum(_rejected(port).values()) >= i, log)
        reason = "too-large" if kind == "sparse-5g" else "not-regular-file"
        assert _rejected(port).get(reason, 0) >= 1, _rejected(port)
        still_serving()
    assert sum(_rejected(port).values()) == len(KINDS), _rejected(port)
    changes = _changes(port)
    (work / "node.new").write_text("name: n1\nlabels: {zone: b}\n")
    os.replace(work / "node.new", node)
    _wait_for("the valid file to be taken again", lambda: _changes(port) > changes, log)


def test_serve_keeps_serving_while_its_node_config_file_turns_hostile(work: Path, backend: Path) -> None:
    log, port = work / "proxy.log", _free_port()
    proxy = ProxyProcess(["--backend", str(backend), "--node-config", str(work / "node.yaml"),
                          "--metrics-addr", f"127.0.0.1:{port}",
                          "--hook-server-dir", str(work / "hs"), "--no-entry-points",
                          "--cgroup-root", str(work / "cg"), "--grace", "1"],
                         env={"RHP_LOG_LEVEL": "info"}, log=log)
    proxy.start(str(work / "p.sock"))
    try:
        def version_answered() -> None:
            with grpc.insecure_channel(f"unix://{work / 'p.sock'}") as channel:
                assert channel.unary_unary("/runtime.v1.RuntimeService/Version")(b"", timeout=HANG_GUARD) == b""

        _swap_every_kind(work, port, log, version_answered)
    finally:
        code = proxy.terminate(HANG_GUARD)
        release_fifo_readers(work)
    assert code == 0, log.read_text()[-2000:]


async def test_nri_keeps_serving_while_its_node_config_file_turns_hostile(work: Path) -> None:
    runtime = await FakeRuntime(work / "nri.sock").start()
    log, port = work / "nri.log", _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runtime_proxy.cli", "--log-format", "json", "--log-level", "info", "nri",
            "--nri-socket", str(runtime.path), "--node-config", str(work / "node.yaml"),
            "--hook-server-dir", str(work / "hs"), "--no-entry-points", "--cgroup-root", str(work / "cg"),
            "--metrics-addr", f"127.0.0.1:{port}", "--dry-run", env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        session = await runtime.next_session(timeout=HANG_GUARD)
        await asyncio.wait_for(session.registered.wait(), HANG_GUARD)
        await session.call("Configure", nri_pb2.ConfigureRequest(runtime_name="fake", runtime_version="1"),
                           timeout=HANG_GUARD)
        await session.call("Synchronize", nri_pb2.SynchronizeRequest(), timeout=HANG_GUARD)
        loop = asyncio.get_running_loop()

        def call_answered() -> None:
            pod = nri_pb2.PodSandbox(id="sb1", name="web", uid="u1", namespace="default")
            request = nri_pb2.StateChangeEvent(event=nri_pb2.Event.RUN_POD_SANDBOX, pod=pod)
            reply = asyncio.run_coroutine_threadsafe(
                session.call("StateChange", request, timeout=HANG_GUARD), loop).result(HANG_GUARD + 5)
            assert not reply.status.code, reply

        await asyncio.to_thread(_swap_every_kind, work, port, log, call_answered)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(proc.wait(), HANG_GUARD)
        except TimeoutError:
            proc.kill()
            code = await proc.wait()
        release_fifo_readers(work)
        await runtime.stop()
    assert code == 0, log.read_text()[-2000:]
