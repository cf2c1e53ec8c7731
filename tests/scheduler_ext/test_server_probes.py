"""The extender's probe app (``scheduler_ext.server.create_health_app``): ``/healthz``,
``/readyz`` from the cache's sync state, ``/metrics`` with ``rhp_build_info``, 404 elsewhere."""

from __future__ import annotations

import httpx

from rhp_ops import build
from scheduler_ext.server import create_health_app
from scheduler_ext.state import ClusterState


async def test_probes_and_build_info() -> None:
    app = create_health_app(ClusterState())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ext") as client:
        assert (await client.get("/healthz")).text == "ok"
        ready = await client.get("/readyz")
        assert ready.status_code == 503 and "pods: not synced" in ready.text
        assert (await client.get("/elsewhere")).status_code == 404
        text = (await client.get("/metrics")).text
        line = next(ln for ln in text.splitlines() if ln.startswith("rhp_build_info{"))
        assert 'component="scheduler-ext"' in line and f'version="{build.version()}"' in line
