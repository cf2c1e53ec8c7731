"""The relay's own CPU cost per call, without sockets: ``Session`` driven with fake transports.

Usage: ``.venv/bin/python benchmarks/transport/parse_bench.py [--tree NAME=TREE ...] [--calls N]
[--rounds R]``

Each round runs, for every tree in turn (this checkout is ``this``), a child process with that
tree first on the import path. The child builds one ``Session`` (``runtime_proxy.cri.relay._session``)
whose transports only collect bytes, and feeds it prepared exchanges: ``--calls`` pass-through
unary calls (request HEADERS + DATA; response HEADERS, DATA, trailers), then as many intercepted
ones (``/bench.Echo/Hooked``, whose hooks return at once). It reports the best of ten passes (thread CPU time)
in microseconds per call. The socket benchmark (``run.py``) measures the whole path; this one
isolates the relay's parsing and bookkeeping, which is what a change to the relay's code moves,
from the noise of a shared host. Figures are medians over the rounds, with ratios against the
first tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _exchanges(calls: int, path: str, first_sid: int) -> tuple[list[bytes], list[bytes]]:
    from hpack import Encoder

    from runtime_proxy.cri.relay import _wire as w

    cenc, senc = Encoder(), Encoder()
    msg = w.grpc_frame(b"x" * 200)
    client, server = [], []
    for i in range(calls):
        sid = first_sid + 2 * i
        req = cenc.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", "localhost"),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            ]
        )
        client.append(w.frame(w.HEADERS, w.FLAG_END_HEADERS, sid, req) + w.frame(w.DATA, w.FLAG_END_STREAM, sid, msg))
        head = senc.encode([(":status", "200"), ("content-type", "application/grpc")])
        trailers = senc.encode([("grpc-status", "0"), ("grpc-message", "")])
        server.append(
            w.window_update(0, len(msg))  # the server reads the request, as a real one does
            + w.frame(w.HEADERS, w.FLAG_END_HEADERS, sid, head)
            + w.frame(w.DATA, 0, sid, msg)
            + w.frame(w.HEADERS, w.FLAG_END_HEADERS | w.FLAG_END_STREAM, sid, trailers)
        )
    return client, server


class _Sink(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.size = 0

    def write(self, data: Any) -> None:
        self.size += len(data)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Call:
    """The intercepted call ``before`` returns (``runtime_proxy.cri.transport.InterceptedCall``)."""

    def __init__(self, request: bytes) -> None:
        self.request = request

    async def after(self, response: bytes) -> None:
        return None


class _Hooks:
    def intercepts(self, method: str) -> bool:
        return method == "/bench.Echo/Hooked"

    async def before(self, method: str, request: bytes) -> _Call:
        return _Call(request)

    async def undecodable(self, method: str, reason: str) -> None:
        return None


async def _child(calls: int) -> dict[str, float]:
    import structlog

    from runtime_proxy.cri.relay import _session
    from runtime_proxy.cri.relay import _wire as w

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    relay_state = _session._RELAY
    out: dict[str, float] = {}
    for name, path in (("pass_through_us", "/bench.Echo/Unary"), ("intercepted_us", "/bench.Echo/Hooked")):
        best = float("inf")
        for _ in range(10):
            s = _session.Session(_Hooks(), "/nonexistent", 1.0, lambda _s: None)  # type: ignore[arg-type]
            s.down, s.up = _Sink(), _Sink()
            s.state = relay_state
            s.data_received(w.PREFACE + w.settings())
            s.server_data(w.settings() + w.SETTINGS_ACK)
            s.data_received(w.SETTINGS_ACK)
            client, server = _exchanges(calls, path, 1)
            t0 = time.thread_time()
            for c, v in zip(client, server, strict=True):
                s.data_received(c)
                s.server_data(v)
            best = min(best, (time.thread_time() - t0) / calls * 1e6)
            assert not s.live and s.state == relay_state, "calls did not finish"
            assert s.up.size > calls * 200 and s.down.size > calls * 200, "bytes did not flow"
            s.close()
        out[name] = best
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=TREE", help="a tree to compare")
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_child(args.calls))))
        return 0
    trees = {"this": str(ROOT), **dict(t.split("=", 1) for t in args.tree)}
    names = list(trees)
    samples: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            tree = str(Path(trees[name]).resolve())
            env = {**os.environ, "PYTHONPATH": tree}
            argv = [sys.executable, str(HERE / "parse_bench.py"), "--child", "--calls", str(args.calls)]
            row = json.loads(subprocess.run(argv, env=env, cwd=tree, capture_output=True, check=True).stdout)
            for key, value in row.items():
                samples[name].setdefault(key, []).append(value)
    results = {n: {k: statistics.median(v) for k, v in rows.items()} for n, rows in samples.items()}
    ref = names[1] if len(names) > 1 else names[0]
    print(f"relay CPU per call without sockets, best of 10 passes, median of {args.rounds} rounds; ratio = x / {ref}")
    print(f"{'metric':22}" + "".join(f"{n:>20}" for n in names))
    for key in ("pass_through_us", "intercepted_us"):
        cells = [f"{results[n][key]:8.2f} ({results[n][key] / results[ref][key]:4.2f}x)" for n in names]
        print(f"{key:22}" + "".join(f"{c:>20}" for c in cells))
    # The spread: each tree's [min, max] over the rounds, and the same round's ratio to ``ref``
    # (the trees of one round run back to back, so a round's ratio shares that round's load).
    print(f"\nspread over the rounds: value [min, max]; per-round ratio to {ref} [min, median, max]")
    for key in ("pass_through_us", "intercepted_us"):
        for n in names:
            vals = samples[n][key]
            ratios = sorted(v / r for v, r in zip(vals, samples[ref][key], strict=True))
            print(
                f"{key:22}{n:>10} {statistics.median(vals):8.2f} [{min(vals):.2f}, {max(vals):.2f}]"
                f"  ratio [{ratios[0]:.2f}, {statistics.median(ratios):.2f}, {ratios[-1]:.2f}]"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
