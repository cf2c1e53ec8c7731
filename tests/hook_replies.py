"""Replies of fake Koordinator hook servers, shared by the unit and the integration tests."""

from __future__ import annotations

from typing import Any

from cri_protos import hookserver_pb2 as pb


def echo_reply(request: Any, *, shares: int = 0, cpuset: str | None = None, ann: dict[str, str] | None = None) -> Any:
    """Koordinator-style answer: the request's resources and annotations, changes on top."""
    resp = pb.ContainerResourceHookResponse(container_annotations=dict(request.container_annotations))
    resp.container_resources.CopyFrom(request.container_resources)
    if shares:
        resp.container_resources.cpu_shares = shares
    if cpuset is not None:
        resp.container_resources.cpuset_cpus = cpuset
    resp.container_annotations.update(ann or {})
    return resp
