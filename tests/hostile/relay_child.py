"""A relay in its own process, for the hostile tests and the long fuzzer: its memory is its own.

``python relay_child.py LISTEN BACKEND [LIMITS_JSON]`` runs ``RelayTransport`` with the transport
suite's ``RecordingInterceptor`` (it intercepts ``/test.Hooked/*``) and the ``RelayLimits`` fields
given as a JSON object. Prints ``ready`` once listening. Each line ``stats`` on stdin is answered
with one JSON line: ``rss_kib`` and ``hwm_kib`` (VmRSS and VmHWM), ``buffered`` (request bytes
held for intercepted calls), ``connections`` and ``hits`` (``rhp_relay_limit_hits_total`` by
limit). Runs until stdin closes or SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime_proxy", "cri"))

from transport_backend import RecordingInterceptor

from runtime_proxy.cri.relay import RelayTransport, new_event_loop

LIMITS = ("header_block", "stream_buffer", "connection_buffer", "total_buffer", "intercepted_streams", "flow_control")


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out["rss_kib" if key == "VmRSS" else "hwm_kib"] = int(value.split()[0])
    return out


def _hits() -> dict[str, float]:
    try:
        from prometheus_client import REGISTRY
    except ImportError:  # pragma: no cover - a dependency
        return {}
    return {name: REGISTRY.get_sample_value("rhp_relay_limit_hits_total", {"limit": name}) or 0.0 for name in LIMITS}


async def main(listen: str, backend: str, limits: dict[str, Any]) -> None:
    kwargs: dict[str, Any] = {"connect_timeout": 1.0}
    if limits:
        from runtime_proxy.cri.relay import RelayLimits  # type: ignore[attr-defined,unused-ignore]

        kwargs["limits"] = RelayLimits(**limits)
    transport = RelayTransport(listen, backend, RecordingInterceptor(), **kwargs)
    await transport.start()
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, done.set)

    def on_stdin() -> None:
        line = sys.stdin.readline()
        if not line:
            loop.remove_reader(sys.stdin.fileno())
            done.set()
            return
        if line.strip() == "stats":
            row: dict[str, Any] = dict(_status())
            row["buffered"] = getattr(transport, "buffered_bytes", -1)
            row["connections"] = transport.connections
            row["hits"] = _hits()
            print(json.dumps(row), flush=True)

    loop.add_reader(sys.stdin.fileno(), on_stdin)
    print("ready", flush=True)
    await done.wait()
    await transport.stop(0.2)


if __name__ == "__main__":
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    event_loop = new_event_loop()
    asyncio.set_event_loop(event_loop)
    event_loop.run_until_complete(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}))
