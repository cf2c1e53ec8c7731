"""A small third-party hook server: Koordinator's RuntimeHookService in plain Python.

It needs only ``grpcio`` and the generated ``cri_protos.hookserver_pb2`` modules that ship with
runtime-hook-proxy. On ``PreCreateContainer`` it looks at two pod labels:

- ``example.com/hello: <text>``: sets the env variable ``HELLO=<text>`` and the container
  annotation ``example.com/greeted: <text>``;
- ``example.com/cpu-shares: <n>``: sets the container's ``cpu_shares`` to ``n``.

Everything else in the request is echoed back unchanged. That matters: the proxy copies the
answer's ``cpuset_cpus``/``cpuset_mems`` even when empty (Koordinator's rule), so an answer
without the request's resources would clear the container's cpuset.

Run it and register it (the proxy picks the file up within a second)::

    python label_hook_server.py --listen /run/label-hooks.sock \
        --register-dir /etc/runtime/hookserver.d --failure-policy Ignore
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import grpc

from cri_protos import hookserver_pb2 as pb
from cri_protos import hookserver_pb2_grpc as pb_grpc

HELLO = "example.com/hello"
SHARES = "example.com/cpu-shares"


def answer_create(req: Any) -> Any:
    """The answer to a PreCreateContainer hook: the request echoed, with our changes on top."""
    resp = pb.ContainerResourceHookResponse(container_annotations=dict(req.container_annotations))
    resp.container_resources.CopyFrom(req.container_resources)  # echo: keeps the cpuset
    labels = req.pod_labels
    if HELLO in labels:
        resp.container_annotations["example.com/greeted"] = labels[HELLO]
        # A non-empty env map replaces the container's environment: send all of it.
        resp.container_envs.update(dict(req.container_envs))
        resp.container_envs["HELLO"] = labels[HELLO]
    if labels.get(SHARES, "").isdigit():
        resp.container_resources.cpu_shares = int(labels[SHARES])
    return resp


class LabelHookServer(pb_grpc.RuntimeHookServiceServicer):  # type: ignore[misc]
    """Implements only PreCreateContainerHook; the proxy calls only the hooks we register."""

    def __init__(self) -> None:
        self.calls = 0

    async def PreCreateContainerHook(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        self.calls += 1
        return answer_create(request)


def register(directory: str, name: str, endpoint: str, policy: str) -> Path:
    """Write the registration file atomically (the temporary name does not end in .json)."""
    doc = {"remote-endpoint": endpoint, "failure-policy": policy, "runtime-hooks": ["PreCreateContainer"]}
    path = Path(directory) / f"{name}.json"
    tmp = Path(directory) / f".{name}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return path


async def start(listen: str, servicer: LabelHookServer | None = None) -> grpc.aio.Server:
    server = grpc.aio.server()
    pb_grpc.add_RuntimeHookServiceServicer_to_server(servicer or LabelHookServer(), server)
    server.add_insecure_port(f"unix://{listen}")
    await server.start()
    return server


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True, help="unix socket path to serve on")
    p.add_argument("--register-dir", help="hook-server registration directory")
    p.add_argument("--name", default="label-hooks", help="registration file name (without .json)")
    p.add_argument("--failure-policy", choices=("Fail", "Ignore"), default="Ignore")
    args = p.parse_args()
    if os.path.exists(args.listen):
        os.unlink(args.listen)
    server = await start(args.listen)
    registration = register(args.register_dir, args.name, args.listen, args.failure_policy) if args.register_dir \
        else None
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    if registration is not None:
        registration.unlink(missing_ok=True)  # stop being called before we stop answering
    await server.stop(2)


if __name__ == "__main__":
    asyncio.run(main())
