"""Transport benchmark: each transport's cost as ratios against a direct call, in one run.

Usage: ``.venv/bin/python benchmarks/transport/run.py [--quick] [--rounds N] [--python-ends] [--json FILE]
[--baseline NAME=TREE ...] [--only relay] [--koord PATH | --no-koord]``

Ends: the Go echo server and Go client from ``go/`` (built by ``setup.sh`` into
``_work/transport-bench/bin``, or built here when ``go`` is on PATH); without Go, grpcio
(Python) ends with the same call mix, whose ratios say less since the ends are slow themselves.

Targets, each in its own process except ``direct``: direct (client -> echo server), ``floor``
(``floor_relay.py``, a byte copy), ``relay`` (``RelayTransport``) and ``grpc`` (``GrpcTransport``,
when ``runtime_proxy.cri.grpc_transport`` imports). For every target:
  - pass-through unary: sequential calls, p50 and p99 latency;
  - intercepted unary: ``/bench.Echo/Hooked``, whose hook decodes and re-encodes a small CRI
    ``CreateContainerRequest`` (for direct and floor it is just another call);
  - 16-concurrent throughput: calls per second, 16 callers on one connection;
  - 1000-message stream: a bidi stream, every message sent and echoed, p50 time;
  - the proxy's peak RSS (VmHWM) and CPU time per pass-through call.
``koord`` is Koordinator's koord-runtime-proxy v1.8.0 (``scripts/build-koord.sh`` builds it; ``--koord
PATH`` or that script's cached binary; skipped, with the reason printed, when it is not built or a
hook server is registered in its fixed hook directory) in containerd mode with no hook server, in
front of the same echo server: everything but CRI's RuntimeService goes through its transparent
gRPC proxy (``mwitkow/grpc-proxy``, the path CRI's ImageService and any other service takes), so
pass-through, throughput and stream are measured on the same ``/bench.Echo`` methods as the other
targets. Its "intercepted" call is ``/runtime.v1.RuntimeService/CreateContainer`` with the same
payload: decoded, parsed into a hook request (no hook to call), sent on by its typed CRI client
(the echo answer decodes as a ``CreateContainerResponse``), its container store written, a log
line written; for the other targets that row is ``/bench.Echo/Hooked``.
``--baseline NAME=TREE`` adds a target ``NAME``: the relay of another source tree (for example a
``git worktree add /tmp/base COMMIT``), run by that tree's ``serve.py`` with that tree first on
the import path, so a change is measured against its base in the same interleaved run and the
report adds a ratio column against the first baseline. ``--only relay`` leaves out floor and grpc.
Every proxy runs for the whole benchmark, and each measurement is taken against all targets in
turn, ``--rounds`` times in rotated order; a figure is the median of its rounds. Speed is
reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BIN = ROOT / "_work" / "transport-bench" / "bin"
PY = sys.executable
sys.path[:0] = [str(ROOT), str(HERE)]


def small_request() -> bytes:
    from cri_protos import api_pb2

    req = api_pb2.CreateContainerRequest(pod_sandbox_id="f" * 64)
    req.config.metadata.name = "app"
    req.config.image.image = "registry.local/app:1.0"
    req.config.labels["io.kubernetes.pod.name"] = "web-0"
    req.config.annotations["koordinator.sh/qosClass"] = "LS"
    req.config.linux.resources.cpu_shares = 1024
    req.config.linux.resources.memory_limit_in_bytes = 512 << 20
    return req.SerializeToString()


KOORD_HOOK_DIR = Path("/etc/runtime/hookserver.d")  # fixed in koord-runtime-proxy v1.8.0's code
KOORD_HOOKED = "/runtime.v1.RuntimeService/CreateContainer"


def koord_binary(explicit: str | None) -> tuple[Path | None, str]:
    """The koord-runtime-proxy binary to run, or None with the reason the target is skipped."""
    if explicit:
        path = Path(explicit)
    else:
        found = subprocess.run(
            ["bash", str(ROOT / "scripts" / "build-koord.sh"), "--print-path"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        lines = found.stdout.strip().splitlines()
        if found.returncode != 0 or not lines:
            return None, f"scripts/build-koord.sh --print-path failed: {found.stderr.strip()[-300:]}"
        path = Path(lines[-1])
    if not (path.is_file() and os.access(path, os.X_OK)):
        return None, f"no binary at {path} (bash scripts/build-koord.sh builds it)"
    registered = sorted(KOORD_HOOK_DIR.glob("*json")) if KOORD_HOOK_DIR.is_dir() else []
    if registered:
        return None, f"hook servers registered in {KOORD_HOOK_DIR} ({registered[0].name}): not a pass-through"
    return path, ""


def start_koord(binary: Path, listen: str, backend: str, log: str) -> subprocess.Popen[bytes]:
    """koord-runtime-proxy in containerd mode on *listen*, in front of *backend*; up once it listens."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                str(binary),
                "--koord-runtimeproxy-endpoint",
                listen,
                "--remote-runtime-service-endpoint",
                backend,
                "--backend-runtime-mode",
                "Containerd",
            ],
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + 60
    while not os.path.exists(listen):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"koord-runtime-proxy did not listen on {listen}: see {log}")
        time.sleep(0.05)
    return proc


def koord_pod() -> tuple[bytes, bytes]:
    """(a ``RunPodSandboxRequest``, the ``CreateContainerRequest`` of ``small_request`` in that pod) for
    koord-runtime-proxy's intercepted call. koord-runtime-proxy v1.8.0 checkpoints a created container
    under its pod and dereferences the pod's record without a check: a CreateContainer for a pod it
    has not seen crashes the whole process (nil pointer in ``ContainerResourceExecutor.ResourceCheckPoint``).
    So the pod is run first. Behind the echo server the pod's id is the echo of the request's first
    field, the encoded ``PodSandboxConfig``; every byte of it is below 0x80, so it is valid UTF-8 and
    decodes as the ``pod_sandbox_id`` string, and the container is created with that id."""
    from cri_protos import api_pb2

    run = api_pb2.RunPodSandboxRequest()
    run.config.metadata.name = "web-0"
    run.config.metadata.uid = "0b6f2a3e-0000-4000-8000-000000000001"
    run.config.metadata.namespace = "default"
    run.config.labels["io.kubernetes.pod.name"] = "web-0"
    run.config.annotations["koordinator.sh/qosClass"] = "LS"
    run.config.linux.cgroup_parent = "/kubepods/burstable/pod0b6f2a3e"
    pod_id = run.config.SerializeToString()
    assert max(pod_id) < 0x80, "the pod config must encode to ASCII to echo as a valid id"
    create = api_pb2.CreateContainerRequest.FromString(small_request())
    create.pod_sandbox_id = pod_id.decode()
    create.sandbox_config.CopyFrom(run.config)
    return run.SerializeToString(), create.SerializeToString()


def go_available() -> bool:
    if (BIN / "echoserver").exists() and (BIN / "client").exists():
        return True
    if shutil.which("go") is None:
        return False
    result = subprocess.run(["bash", str(HERE / "setup.sh"), "--build-only"], capture_output=True, text=True)
    if result.returncode != 0:
        print("building the Go ends failed; using Python ends:\n" + result.stderr[-2000:], file=sys.stderr)
        return False
    return (BIN / "echoserver").exists()


def start(argv: list[str], root: Path = ROOT) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != b"ready":
        proc.kill()
        raise RuntimeError(f"{argv} did not start: {line!r}")
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def proc_stats(pid: int) -> tuple[float, float]:
    """(peak RSS in MiB, CPU seconds) of a process."""
    hwm = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return hwm, (int(fields[11]) + int(fields[12])) / ticks


class Ends:
    """Go or Python client and echo server."""

    def __init__(self, go: bool, quick: bool) -> None:
        self.go = go
        self.n = 500 if quick else 3000
        self.seconds = 1.0 if quick else 3.0
        self.reps = 5 if quick else 20

    def server(self, path: str) -> subprocess.Popen[bytes]:
        if self.go:
            return start([str(BIN / "echoserver"), "-listen", path])
        return start([PY, str(HERE / "py_ends.py"), "server", path])

    def client(self, path: str, mode: str, method: str, payload: bytes, calls: int = 0) -> dict[str, Any]:
        n, reps = (calls, 1) if calls else (self.n, self.reps)
        if self.go:
            argv = [
                str(BIN / "client"),
                "-addr",
                path,
                "-mode",
                mode,
                "-method",
                method,
                "-payload",
                payload.hex(),
                "-n",
                str(n),
                "-seconds",
                str(self.seconds),
                "-reps",
                str(reps),
            ] + (["-warmup", "0"] if calls else [])
        else:
            argv = [
                PY,
                str(HERE / "py_ends.py"),
                "client",
                path,
                mode,
                method,
                payload.hex(),
                str(n),
                str(self.seconds),
                str(reps),
            ]
        out = subprocess.run(argv, capture_output=True, check=True, timeout=600).stdout
        result: dict[str, Any] = json.loads(out)
        return result


# The four measurements, each a client run against one target.
KINDS = ("unary", "hooked", "conc", "stream")


def measure(
    ends: Ends,
    path: str,
    payload: bytes,
    kind: str,
    hooked: str = "/bench.Echo/Hooked",
    hooked_payload: bytes | None = None,
) -> dict[str, float]:
    """One client run of ``kind`` against the socket at ``path``; ``hooked`` is the intercepted method."""
    if kind == "unary":
        r = ends.client(path, "unary", "/bench.Echo/Unary", payload)
        return {"unary_p50_us": r["p50_us"], "unary_p99_us": r["p99_us"]}
    if kind == "hooked":
        r = ends.client(path, "unary", hooked, hooked_payload or payload)
        return {"hooked_p50_us": r["p50_us"], "hooked_p99_us": r["p99_us"]}
    if kind == "conc":
        return {"conc16_calls_per_s": ends.client(path, "conc", "/bench.Echo/Unary", payload)["calls_per_s"]}
    return {"stream1000_p50_ms": ends.client(path, "stream", "/bench.Echo/Stream", payload)["p50_ms"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--python-ends", action="store_true", help="use grpcio ends even when Go is there")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--rounds", type=int, default=0, help="interleaved rounds per measurement (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="NAME=TREE",
        help="also run the relay of source tree TREE as target NAME (repeatable)",
    )
    parser.add_argument("--only", choices=["relay"], help="leave out the floor and grpc targets")
    parser.add_argument("--koord", help="koord-runtime-proxy binary (default: scripts/build-koord.sh's cached one)")
    parser.add_argument("--no-koord", action="store_true", help="leave out the koord-runtime-proxy target")
    parser.add_argument("--no-grpc", action="store_true", help="leave out the grpc transport (the slowest target)")
    args = parser.parse_args()
    baselines = dict(b.split("=", 1) for b in args.baseline)

    args.rounds = args.rounds or (1 if args.quick else 3)
    go = not args.python_ends and go_available()
    ends = Ends(go, args.quick)
    payload = small_request()
    targets = ["direct", "relay"] if args.only else ["direct", "floor", "relay"]
    try:
        import runtime_proxy.cri.grpc_transport  # noqa: F401

        if not args.only and not args.no_grpc:
            targets.append("grpc")
    except ImportError:
        print("runtime_proxy.cri.grpc_transport not importable: skipping the grpc transport", file=sys.stderr)
    targets += list(baselines)
    koord: Path | None = None
    if not args.no_koord:
        koord, why = koord_binary(args.koord)
        if koord is None:
            print(f"koord-runtime-proxy target skipped: {why}")
        else:
            targets.append("koord")
    # koord-runtime-proxy creates its hook directory; leave the machine as found.
    made_hook_dir = koord is not None and not KOORD_HOOK_DIR.exists()
    koord_create = b""

    tmp = tempfile.mkdtemp(prefix="rhp-bench-")
    backend_path = os.path.join(tmp, "echo.sock")
    server = ends.server(backend_path)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    paths = {"direct": backend_path}
    samples: dict[str, dict[str, list[float]]] = {t: {} for t in targets}
    try:
        for target in targets[1:]:
            listen = paths[target] = os.path.join(tmp, f"{target}.sock")
            if target == "floor":
                procs[target] = start([PY, str(HERE / "floor_relay.py"), listen, backend_path])
            elif target == "koord" and koord is not None:
                procs[target] = start_koord(koord, listen, backend_path, os.path.join(tmp, "koord.log"))
                run_pod, koord_create = koord_pod()
                ends.client(listen, "unary", "/runtime.v1.RuntimeService/RunPodSandbox", run_pod, calls=1)
            elif target in baselines:
                tree = Path(baselines[target]).resolve()
                serve = tree / "benchmarks" / "transport" / "serve.py"
                procs[target] = start([PY, str(serve), "relay", listen, backend_path], tree)
            else:
                procs[target] = start([PY, str(HERE / "serve.py"), target, listen, backend_path])
        # Interleaved: each measurement runs against every target in turn, ``rounds`` times, in
        # a rotated order, so a slow moment of the host lands on all targets alike instead of
        # on whichever target happened to be measured then. Each figure is the median of its
        # rounds; a ratio compares medians taken over the same stretch of time.
        for kind in KINDS:
            for rnd in range(args.rounds):
                order = targets[rnd % len(targets) :] + targets[: rnd % len(targets)]
                for target in order:
                    proc = procs.get(target)
                    cpu0 = proc_stats(proc.pid)[1] if proc else 0.0
                    if target == "koord":
                        row = measure(ends, paths[target], payload, kind, KOORD_HOOKED, koord_create)
                    else:
                        row = measure(ends, paths[target], payload, kind)
                    if proc and kind == "unary":
                        row["cpu_us_per_call"] = (proc_stats(proc.pid)[1] - cpu0) / (ends.n + 200) * 1e6
                    for key, value in row.items():
                        samples[target].setdefault(key, []).append(value)
        for target, proc in procs.items():
            samples[target]["rss_mib"] = [proc_stats(proc.pid)[0]]
    finally:
        for proc in procs.values():
            stop(proc)
        stop(server)
        shutil.rmtree(tmp, ignore_errors=True)
        if made_hook_dir:
            shutil.rmtree(KOORD_HOOK_DIR, ignore_errors=True)
    results = {t: {k: statistics.median(v) for k, v in rows.items()} for t, rows in samples.items()}

    report(results, "Go" if go else "Python (grpcio)")
    report_markdown(samples)
    if baselines:
        report_against(results, next(iter(baselines)))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"ends": "go" if go else "python", "results": results, "samples": samples}, indent=2)
        )
    return 0


# (metric, label, higher is better)
METRICS = [
    ("unary_p50_us", "pass-through unary p50 (us)", False),
    ("unary_p99_us", "pass-through unary p99 (us)", False),
    ("hooked_p50_us", "intercepted unary p50 (us)", False),
    ("hooked_p99_us", "intercepted unary p99 (us)", False),
    ("conc16_calls_per_s", "16-concurrent throughput (calls/s)", True),
    ("stream1000_p50_ms", "1000-message stream p50 (ms)", False),
]


def report(results: dict[str, dict[str, float]], ends: str) -> None:
    direct = results["direct"]
    names = list(results)
    print(f"\ntransport benchmark, {ends} ends, {time.strftime('%Y-%m-%d %H:%M')}; ratio = target / direct")
    head = f"{'metric':38}" + "".join(f"{n:>22}" for n in names)
    print(head)
    print("-" * len(head))
    for key, label, _higher in METRICS:
        cells = []
        for n in names:
            value = results[n][key]
            cells.append(f"{value:10.1f}" + ("" if n == "direct" else f" ({value / direct[key]:5.2f}x)"))
        print(f"{label:38}" + "".join(f"{c:>22}" for c in cells))
    for key, label in (
        ("cpu_us_per_call", "proxy CPU per pass-through call (us)"),
        ("rss_mib", "proxy peak RSS (MiB)"),
    ):
        print(f"{label:38}" + "".join(f"{results[n].get(key, float('nan')):>22.1f}" for n in names))


def cell(values: list[float], fmt: str = "{:.1f}") -> str:
    """Median and [min, max] of a measurement's rounds."""
    if not values:
        return "n/a"
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def report_markdown(samples: dict[str, dict[str, list[float]]]) -> None:
    """The README's table: median [min, max] over the rounds; "added" is a round's figure minus the
    same round's direct figure, and the floor row divides its median by the floor's median."""
    names = list(samples)
    print("\n| measure | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    direct = samples["direct"]
    floor = samples.get("floor")
    for key, label, _higher in METRICS:
        print(f"| {label} | " + " | ".join(cell(samples[n].get(key, [])) for n in names) + " |")
        if key not in ("unary_p50_us", "hooked_p50_us"):
            continue
        added = {n: [t - d for t, d in zip(samples[n].get(key, []), direct[key], strict=False)] for n in names}
        print(f"| {label}, added over direct | n/a | " + " | ".join(cell(added[n]) for n in names[1:]) + " |")
        if floor is not None and key == "unary_p50_us":
            # a ratio of the medians: one round's floor can add next to nothing, and a per-round
            # ratio over it says nothing
            base = statistics.median(added["floor"])
            cells = [f"{statistics.median(added[n]) / base:.2f}" if base > 0 else "n/a" for n in names[1:]]
            print(f"| {label}, median added / floor's median added | n/a | " + " | ".join(cells) + " |")
    for key, label in (
        ("cpu_us_per_call", "proxy CPU per pass-through call (us)"),
        ("rss_mib", "proxy peak RSS (MiB)"),
    ):
        print(f"| {label} | n/a | " + " | ".join(cell(samples[n].get(key, [])) for n in names[1:]) + " |")


def report_against(results: dict[str, dict[str, float]], base: str) -> None:
    """Every relay target against the baseline ``base``, measured in the same interleaved run."""
    names = [n for n in results if n not in ("direct", "floor", "grpc", base)]
    print(f"\nagainst {base} (same run); ratio = target / {base}")
    head = f"{'metric':38}" + f"{base:>14}" + "".join(f"{n:>24}" for n in names)
    print(head)
    print("-" * len(head))
    keys = [(k, label) for k, label, _h in METRICS]
    keys += [("cpu_us_per_call", "proxy CPU per pass-through call (us)"), ("rss_mib", "proxy peak RSS (MiB)")]
    for key, label in keys:
        ref = results[base].get(key, float("nan"))
        cells = [
            f"{results[n].get(key, float('nan')):10.1f} ({results[n].get(key, float('nan')) / ref:5.2f}x)"
            for n in names
        ]
        print(f"{label:38}{ref:>14.1f}" + "".join(f"{c:>24}" for c in cells))


if __name__ == "__main__":
    sys.exit(main())
