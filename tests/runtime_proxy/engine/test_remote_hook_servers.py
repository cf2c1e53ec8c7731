"""Hook servers without containerd: registration parsing, Koordinator's merge rules, calling
order, the registry's reloads and channel cache, and our hook server end to end over a unix
socket (``runtime_proxy.hookclient``, ``runtime_proxy.commands.hook_server``)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from cri_protos import hookserver_pb2 as pb
from cri_protos import hookserver_pb2_grpc as pb_grpc
from hooks.facts import ContainerFacts, NodeFacts, PodFacts, Resources, frozen_map
from runtime_proxy.codecs.hook import (
    container_facts_from_request,
    container_plan_from_response,
    container_request,
    merge_resources,
    pod_facts_from_request,
    pod_plan_from_response,
    pod_request,
)
from runtime_proxy.commands.hook_server import HookServerOptions, serve
from runtime_proxy.engine.pipeline import Pipeline
from runtime_proxy.hookclient.registration import RegistrationError, parse_registration
from runtime_proxy.hookclient.registry import HookServerRegistry
from tests.hook_replies import echo_reply

# ---- registration files -----------------------------------------------------------------------

GOOD = {"remote-endpoint": "/run/x.sock", "failure-policy": "Fail", "runtime-hooks": ["PreCreateContainer"]}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param({}, ("/run/x.sock", "Fail", ("PreCreateContainer",), 2.0), id="plain"),
        pytest.param({"remote-endpoint": "unix:///run/x.sock"}, ("/run/x.sock", "Fail", ("PreCreateContainer",), 2.0),
                     id="unix-scheme"),
        pytest.param({"failure-policy": "Ignore"}, ("/run/x.sock", "Ignore", ("PreCreateContainer",), 2.0),
                     id="ignore"),
        pytest.param({"failure-policy": ""}, ("/run/x.sock", "Ignore", ("PreCreateContainer",), 2.0),
                     id="empty-policy-is-ignore"),
        pytest.param({"failure-policy": "None"}, ("/run/x.sock", "Ignore", ("PreCreateContainer",), 2.0),
                     id="none-policy-is-ignore"),
        pytest.param({"failure-policy": None}, ("/run/x.sock", "Ignore", ("PreCreateContainer",), 2.0),
                     id="null-policy-is-ignore"),
        pytest.param({"runtime-hooks": ["PreRunPodSandbox", "PreRemoveRunPodSandbox", "PreRunPodSandbox"]},
                     ("/run/x.sock", "Fail", ("PreRunPodSandbox",), 2.0), id="unknown-and-duplicate-hooks"),
        pytest.param({"timeout-seconds": 0.25}, ("/run/x.sock", "Fail", ("PreCreateContainer",), 0.25),
                     id="timeout-extension"),
    ],
)
def test_registration_parses(changes: dict[str, Any], expected: tuple[Any, ...]) -> None:
    reg = parse_registration("a.json", json.dumps({**GOOD, **changes}), 2.0)
    assert (reg.endpoint, reg.policy, reg.hooks, reg.timeout) == expected


def test_registration_without_policy_is_ignore() -> None:
    doc = {k: v for k, v in GOOD.items() if k != "failure-policy"}
    assert parse_registration("a.json", json.dumps(doc), 2.0).policy == "Ignore"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("{nope", "not valid JSON", id="bad-json"),
        pytest.param("[]", "JSON object", id="not-object"),
        pytest.param(json.dumps({**GOOD, "remote-endpoint": ""}), "remote-endpoint", id="empty-endpoint"),
        pytest.param(json.dumps({k: v for k, v in GOOD.items() if k != "remote-endpoint"}), "remote-endpoint",
                     id="no-endpoint"),
        pytest.param(json.dumps({**GOOD, "remote-endpoint": "tcp://1.2.3.4:5"}), "unix", id="tcp"),
        pytest.param(json.dumps({**GOOD, "remote-endpoint": "run/x.sock"}), "absolute", id="relative"),
        pytest.param(json.dumps({**GOOD, "failure-policy": "fail"}), "failure-policy", id="bad-policy"),
        pytest.param(json.dumps({**GOOD, "runtime-hooks": "PreCreateContainer"}), "runtime-hooks",
                     id="hooks-not-list"),
        pytest.param(json.dumps({k: v for k, v in GOOD.items() if k != "runtime-hooks"}), "runtime-hooks",
                     id="no-hooks"),
        pytest.param(json.dumps({**GOOD, "timeout-seconds": 0}), "timeout", id="zero-timeout"),
        pytest.param(json.dumps({**GOOD, "timeout-seconds": True}), "timeout", id="bool-timeout"),
        pytest.param(json.dumps({**GOOD, "timeout-seconds": "1"}), "timeout", id="string-timeout"),
        pytest.param(json.dumps({**GOOD, "extra-key": 1}), "extra-key: unknown key", id="unknown-key"),
        pytest.param(json.dumps({**GOOD, "failure_policy": "Fail"}),
                     "failure_policy: unknown key; did you mean failure-policy",
                     id="underscore-key-names-the-dashed-one"),
        pytest.param(json.dumps({**GOOD, "runtime-hooks": ["PreCreateContainer", 7]}),
                     "runtime-hooks.1: must be a string", id="hook-name-not-a-string"),
    ],
)
def test_malformed_registration(text: str, reason: str) -> None:
    with pytest.raises(RegistrationError, match=reason):
        parse_registration("a.json", text, 2.0)


# ---- merge rules ------------------------------------------------------------------------------

SEEN = Resources(
    cpu_period=100000, cpu_quota=50000, cpu_shares=256, memory_limit_in_bytes=1 << 30, oom_score_adj=900,
    cpuset_cpus="0-3", cpuset_mems="0", memory_swap_limit_in_bytes=1 << 30, unified=frozen_map({"a": "1"}),
)


def _answer(**fields: Any) -> Any:
    unified = fields.pop("unified", {})
    msg = pb.LinuxContainerResources(**fields)
    msg.unified.update(unified)
    return msg


def _echo(**changes: Any) -> Any:
    base = {k: v for k, v in SEEN.to_dict().items() if k not in ("unified", "hugepage_limits")}
    return _answer(**{**base, "unified": dict(SEEN.unified), **changes})


@pytest.mark.parametrize(
    ("answer", "changes"),
    [
        pytest.param(_echo(), {}, id="echo-changes-nothing"),
        pytest.param(_echo(cpu_shares=777), {"cpu_shares": 777}, id="shares"),
        pytest.param(_echo(cpu_shares=0, cpu_period=0, memory_limit_in_bytes=0, memory_swap_limit_in_bytes=0), {},
                     id="zero-period-shares-memory-swap-kept"),
        pytest.param(_echo(cpu_shares=-5, memory_limit_in_bytes=-1), {}, id="negative-shares-memory-kept"),
        pytest.param(_echo(cpu_quota=-1), {"cpu_quota": -1}, id="quota-minus-one-applies"),
        pytest.param(_echo(cpu_quota=0), {}, id="quota-zero-kept"),
        pytest.param(_echo(oom_score_adj=0), {"oom_score_adj": 0}, id="oom-zero-overwrites"),
        pytest.param(_echo(oom_score_adj=-1000), {"oom_score_adj": -1000}, id="oom-lower-bound"),
        pytest.param(_echo(oom_score_adj=1001), {}, id="oom-out-of-range-kept"),
        pytest.param(_echo(cpuset_cpus=""), {"cpuset_cpus": ""}, id="empty-cpuset-clears"),
        pytest.param(_echo(cpuset_cpus="0", cpuset_mems=""), {"cpuset_cpus": "0", "cpuset_mems": ""},
                     id="cpusets-always-copied"),
        pytest.param(_answer(cpu_shares=10), {"cpu_shares": 10, "oom_score_adj": 0, "cpuset_cpus": "",
                                              "cpuset_mems": ""}, id="partial-answer-clears-cpuset-and-oom"),
        pytest.param(_echo(unified={"b": "2"}), {"unified": {"a": "1", "b": "2"}}, id="unified-overlay"),
        pytest.param(_echo(unified={"a": "1"}), {}, id="unified-same"),
    ],
)
def test_resource_merge_rules(answer: Any, changes: dict[str, Any]) -> None:
    assert merge_resources(SEEN, answer) == changes


POD = PodFacts(name="p", namespace="ns", uid="u1", labels=frozen_map({"l": "1"}),
               annotations=frozen_map({"a": "1"}), cgroup_parent="/kubepods/burstable/podu1")
CONTAINER = ContainerFacts(name="c", attempt=1, annotations=frozen_map({"ca": "1"}), resources=SEEN,
                           envs=frozen_map({"A": "1", "B": "2"}))


def test_pod_response_overlay_and_cgroup_parent() -> None:
    resp = pb.PodSandboxHookResponse(labels={"l": "1", "new": "x"}, annotations={"a": "2"}, cgroup_parent="")
    plan = pod_plan_from_response(POD, resp)
    assert (plan.labels, plan.annotations, plan.cgroup_parent) == ({"new": "x"}, {"a": "2"}, None)
    resp.resources.cpu_shares = 5  # pod resources are ignored in containerd mode
    resp.cgroup_parent = "/other"
    plan = pod_plan_from_response(POD, resp)
    assert plan.cgroup_parent == "/other" and not plan.resources


def test_container_response_create_and_update() -> None:
    resp = pb.ContainerResourceHookResponse(
        container_annotations={"ca": "1", "x": "y"}, pod_cgroup_parent="/new", container_envs={"A": "9"}
    )
    resp.container_resources.CopyFrom(_echo(cpu_shares=777))
    plan = container_plan_from_response("PreCreateContainer", POD, CONTAINER, resp)
    assert plan.resources == {"cpu_shares": 777}
    assert plan.annotations == {"x": "y"}
    assert plan.cgroup_parent == "/new"
    assert plan.envs == {"A": "9"}  # B is kept: a plan cannot delete a variable
    update = container_plan_from_response("PreUpdateContainerResources", POD, CONTAINER, resp)
    assert update.resources == {"cpu_shares": 777}
    assert not (update.annotations or update.envs or update.cgroup_parent)


def test_container_response_without_resources_changes_nothing() -> None:
    plan = container_plan_from_response("PreCreateContainer", POD, CONTAINER, pb.ContainerResourceHookResponse())
    assert plan.is_empty()


def test_requests_round_trip_to_facts() -> None:
    req = container_request(POD, CONTAINER.replace(id="abc"))
    back = container_facts_from_request(req)
    assert back.resources == SEEN and back.id == "abc" and dict(back.envs) == dict(CONTAINER.envs)
    pod = pod_facts_from_request(req)
    assert (pod.uid, dict(pod.labels), pod.cgroup_parent) == ("u1", {"l": "1"}, POD.cgroup_parent)
    assert pod_facts_from_request(pod_request(POD)) == POD.replace(sandbox_id="")


# ---- fake hook servers over unix sockets ----------------------------------------------------------

Handler = Callable[[str, Any], Any]


class FakeServer(pb_grpc.RuntimeHookServiceServicer):  # type: ignore[misc]
    """Answers every container hook with ``handler(stage, request)``; records the calls."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.calls: list[tuple[str, Any]] = []

    async def PreCreateContainerHook(self, request: Any, context: Any) -> Any:
        self.calls.append(("PreCreateContainer", request))
        return await self.handler("PreCreateContainer", request)

    async def PostStartContainerHook(self, request: Any, context: Any) -> Any:
        self.calls.append(("PostStartContainer", request))
        return await self.handler("PostStartContainer", request)


async def _start(servicer: Any, path: Path) -> grpc.aio.Server:
    server = grpc.aio.server()
    pb_grpc.add_RuntimeHookServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


def _register(directory: Path, name: str, endpoint: Path | str, policy: str = "Ignore",
              hooks: tuple[str, ...] = ("PreCreateContainer",), **extra: Any) -> None:
    doc = {"remote-endpoint": str(endpoint), "failure-policy": policy, "runtime-hooks": list(hooks), **extra}
    (directory / name).write_text(json.dumps(doc))


@pytest.fixture
async def sockdir(tmp_path: Path) -> AsyncIterator[Path]:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be long. A fresh name per
    # test: gRPC shares subchannels by address, so a path reused after a test whose server was
    # down would start in that subchannel's connection backoff.
    short = Path(f"/tmp/rhp-hs-{os.getpid()}-{os.urandom(4).hex()}")
    short.mkdir(exist_ok=True)
    yield short
    for p in short.iterdir():
        p.unlink()
    short.rmdir()


async def _run(pipeline: Pipeline, stage: str = "PreCreateContainer", pod: PodFacts = POD) -> Any:
    return await pipeline.run(stage, pod, CONTAINER, NodeFacts())


async def test_registry_order_reload_and_channels(tmp_path: Path, sockdir: Path) -> None:
    seen: list[str] = []

    def make(name: str, **kw: Any) -> FakeServer:
        async def handler(stage: str, req: Any) -> Any:
            seen.append(name)
            return echo_reply(req, **kw)
        return FakeServer(handler)

    a, b = make("a", cpuset="0", ann={"a": "1"}), make("b", shares=600, ann={"b": "2"})
    servers = [await _start(a, sockdir / "a.sock"), await _start(b, sockdir / "b.sock")]
    regdir = tmp_path / "hookserver.d"
    regdir.mkdir()
    _register(regdir, "20-b.json", f"unix://{sockdir / 'b.sock'}")
    _register(regdir, "10-a.json", sockdir / "a.sock")
    (regdir / "05-bad.json").write_text("{not json")
    (regdir / "readme.txt").write_text("not a registration")
    pipeline = Pipeline()
    registry = HookServerRegistry(regdir, pipeline, default_timeout=1.0, poll_interval=0.05)
    await registry.start()
    try:
        assert [s.name for s in pipeline.steps] == ["hookserver:10-a.json", "hookserver:20-b.json"]
        assert list(registry.errors) == ["05-bad.json"]
        result = await _run(pipeline)
        assert seen == ["a", "b"]
        # b saw a's cpuset; both changes merged.
        assert b.calls[0][1].container_resources.cpuset_cpus == "0"
        assert result.plan.resources == {"cpuset_cpus": "0", "cpu_shares": 600}
        assert result.plan.annotations == {"a": "1", "b": "2"}
        assert result.failures == []
        # Remove a: its channel goes away once calls in flight had time to end.
        (regdir / "10-a.json").unlink()
        await _wait(lambda: len(pipeline.steps) == 1)
        await _wait(lambda: registry.endpoints() == [str(sockdir / "b.sock")])
        # Change b's policy; fix the bad file.
        _register(regdir, "20-b.json", sockdir / "b.sock", policy="Fail")
        _register(regdir, "05-bad.json", sockdir / "a.sock", hooks=("PostStartContainer",))
        await _wait(lambda: [s.policy for s in registry.steps] == ["Ignore", "Fail"] and not registry.errors)
    finally:
        await registry.stop()
        for s in servers:
            await s.stop(0)
    assert pipeline.steps == [] and registry.endpoints() == []


async def _wait(cond: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
@pytest.mark.parametrize("fault", ["down", "hangs", "errors"])
async def test_faulty_server_under_policy(tmp_path: Path, sockdir: Path, fault: str, policy: str) -> None:
    async def handler(stage: str, req: Any) -> Any:
        if fault == "hangs":
            await asyncio.sleep(5)
        raise RuntimeError("boom")

    server = None if fault == "down" else await _start(FakeServer(handler), sockdir / "s.sock")
    _register(tmp_path, "s.json", sockdir / "s.sock", policy=policy,
              hooks=("PreCreateContainer", "PostStartContainer"), **{"timeout-seconds": 0.3})
    pipeline = Pipeline()
    registry = HookServerRegistry(tmp_path, pipeline, poll_interval=10)
    await registry.start()
    try:
        started = asyncio.get_running_loop().time()
        result = await _run(pipeline)
        assert asyncio.get_running_loop().time() - started < 2
        assert [f.kind for f in result.failures] == ["timeout" if fault == "hangs" else "error"]
        assert str(sockdir / "s.sock") in result.failures[0].message
        assert (result.rejected is not None) == (policy == "Fail")
        # Post hooks never reject.
        post = await _run(pipeline, "PostStartContainer")
        assert post.rejected is None and len(post.failures) == 1
    finally:
        await registry.stop()
        if server is not None:
            await server.stop(0)


async def test_skip_label_is_never_sent(tmp_path: Path, sockdir: Path) -> None:
    async def handler(stage: str, req: Any) -> Any:
        return echo_reply(req, shares=5)

    fake = FakeServer(handler)
    server = await _start(fake, sockdir / "s.sock")
    _register(tmp_path, "s.json", sockdir / "s.sock")
    pipeline = Pipeline()
    registry = HookServerRegistry(tmp_path, pipeline, poll_interval=10)
    await registry.start()
    try:
        skip = POD.replace(labels={"runtimeproxy.koordinator.sh/skip-hookserver": "true"})
        assert (await _run(pipeline, pod=skip)).plan.is_empty()
        assert fake.calls == []
    finally:
        await registry.stop()
        await server.stop(0)


# ---- our hook server -----------------------------------------------------------------------------


async def test_our_hook_server_serves_plugins_and_registers(tmp_path: Path, sockdir: Path) -> None:
    regdir = tmp_path / "reg"
    opts = HookServerOptions(
        listen=f"unix://{sockdir / 'ours.sock'}", register_dir=str(regdir), failure_policy="Fail",
        builtins=(), entry_points=False, plugins=("tests.integration.plugins_for_tests:PinPlugin",),
        apply=False,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(opts, stop))
    await _wait(lambda: (regdir / "runtime-hook-proxy.json").exists())
    doc = json.loads((regdir / "runtime-hook-proxy.json").read_text())
    assert doc == {"remote-endpoint": str(sockdir / "ours.sock"), "failure-policy": "Fail",
                   "runtime-hooks": ["PreCreateContainer", "PreUpdateContainerResources"]}
    pipeline = Pipeline()
    registry = HookServerRegistry(regdir, pipeline, poll_interval=10)
    await registry.start()
    try:
        pin = POD.replace(labels={"test": "pin"})
        result = await _run(pipeline, pod=pin)
        assert result.failures == []
        assert result.plan.resources == {"cpuset_cpus": "0", "cpu_shares": 777}
        update = await pipeline.run("PreUpdateContainerResources", pin, CONTAINER, NodeFacts())
        assert update.plan.resources == {"cpu_shares": 555}
        assert (await _run(pipeline)).plan.is_empty()  # unlabelled pod: echo, no change
    finally:
        await registry.stop()
        stop.set()
        await task
    assert not (regdir / "runtime-hook-proxy.json").exists()


def _get(port: int, path: str) -> tuple[int, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


async def test_our_hook_server_serves_metrics_and_probes_that_check_its_socket(sockdir: Path) -> None:
    from rhp_devenv.kube import free_port

    port = free_port()
    listen = sockdir / "probed.sock"
    opts = HookServerOptions(listen=f"unix://{listen}", builtins=(), entry_points=False,
                             plugins=("tests.integration.plugins_for_tests:PinPlugin",), apply=False,
                             metrics_addr=f"127.0.0.1:{port}")  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(serve(opts, stop))
    try:
        await _wait(lambda: listen.exists(), timeout=30)

        async def ready() -> tuple[int, bytes]:
            return await asyncio.to_thread(_get, port, "/readyz")

        for _ in range(300):
            try:
                status, _ = await ready()
            except OSError:
                status = 0
            if status == 200:
                break
            await asyncio.sleep(0.1)
        assert status == 200
        assert (await asyncio.to_thread(_get, port, "/healthz"))[0] == 200
        status, body = await asyncio.to_thread(_get, port, "/metrics")
        assert status == 200 and b"rhp_plugin_duration_seconds" in body and b"rhp_build_info" in body
        # The socket gone (the server no longer reachable): not ready, with the reason.
        os.rename(listen, sockdir / "moved.sock")
        status, body = await ready()
        assert status == 503 and body.strip()
        os.rename(sockdir / "moved.sock", listen)
    finally:
        stop.set()
        await task
