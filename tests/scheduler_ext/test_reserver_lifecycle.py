"""The reservation controller's lifecycle beyond placing (issue 38): garbage collection of
Failed and Succeeded reservations after Koordinator's retention (``isReservationNeedCleanup``,
24h by default), and the controller's death made visible on ``/healthz``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from koord_formats.errors import FormatError
from koord_formats.reservation_spec import read_conditions
from rhp_kube.liveness import all_of
from scheduler_ext.reserve import GC_AFTER, collectable, rfc3339
from scheduler_ext.reserver import ControllerTask
from scheduler_ext.server import create_health_app
from scheduler_ext.state import ClusterState
from tests.scheduler_ext.test_reservation_placing import T0, Rig, reservation_obj, web

DAY = 86400.0


def test_koordinators_default_retention_is_a_day() -> None:
    assert GC_AFTER == DAY


def _finished(phase: str, reason: str, *, probe: float, moved: float) -> dict[str, Any]:
    obj = reservation_obj("r")
    obj["status"] = {"phase": phase, "nodeName": "n1", "conditions": [
        {"type": "Scheduled", "status": "True", "reason": "Scheduled",
         "lastProbeTime": rfc3339(T0 - 10 * DAY), "lastTransitionTime": rfc3339(T0 - 10 * DAY)},
        {"type": "Ready", "status": "False", "reason": reason,
         "lastProbeTime": rfc3339(probe), "lastTransitionTime": rfc3339(moved)}]}  # fmt: skip
    return obj


@pytest.mark.parametrize(
    ("phase", "reason", "probe", "moved", "after", "due"),
    [
        # Failed (expired): the Expired condition's lastTransitionTime counts
        ("Failed", "Expired", T0, T0 - DAY - 1, DAY, True),
        ("Failed", "Expired", T0 - 2 * DAY, T0 - DAY + 1, DAY, False),
        # Succeeded (allocateOnce used): the Succeeded condition's lastProbeTime counts
        ("Succeeded", "Succeeded", T0 - DAY - 1, T0, DAY, True),
        ("Succeeded", "Succeeded", T0 - DAY + 1, T0 - 2 * DAY, DAY, False),
        # no condition of the phase's reason: kept
        ("Failed", "Other", T0 - 9 * DAY, T0 - 9 * DAY, DAY, False),
        ("Succeeded", "Expired", T0 - 9 * DAY, T0 - 9 * DAY, DAY, False),
        # Available and Pending are never collected
        ("Available", "Expired", T0 - 9 * DAY, T0 - 9 * DAY, DAY, False),
        ("Pending", "Expired", T0 - 9 * DAY, T0 - 9 * DAY, DAY, False),
        # a configured retention; 0 turns collection off
        ("Failed", "Expired", T0, T0 - 61, 60.0, True),
        ("Failed", "Expired", T0, T0 - 9 * DAY, 0.0, False),
    ],
)
def test_collectable_follows_koordinator(phase: str, reason: str, probe: float, moved: float, after: float,
                                         due: bool) -> None:  # fmt: skip
    assert collectable(_finished(phase, reason, probe=probe, moved=moved), T0, after) is due


def test_read_conditions_reads_times() -> None:
    (c,) = read_conditions({"conditions": [{"type": "Ready", "status": "False", "reason": "Expired",
                                            "lastTransitionTime": "2026-05-28T20:26:40Z"}]})  # fmt: skip
    assert (c.type, c.status, c.reason, c.last_transition, c.last_probe) == ("Ready", "False", "Expired", T0, None)


def test_an_expired_reservation_is_deleted_after_the_retention() -> None:
    rig = Rig()
    rig.reserver.gc_after = 3600.0
    rig.add(reservation_obj("r1", cpu="2", ttl="1m"))
    rig.round()
    rig.now = T0 + 61
    rig.round()
    assert rig.get("r1")["status"]["phase"] == "Failed"
    rig.now += 3599
    rig.round()
    assert "r1" in rig.api.reservations  # not yet
    rig.now += 2
    rig.round()
    assert "r1" not in rig.api.reservations and rig.api.writes[-1] == "delete r1"


def test_a_succeeded_reservation_is_deleted_after_the_retention_and_an_available_one_stays() -> None:
    rig = Rig()
    rig.add(reservation_obj("once", cpu="2"))
    rig.add(reservation_obj("kept", cpu="2", allocate_once=False, ttl="0s", owners=[
        {"labelSelector": {"matchLabels": {"app": "other"}}}]))  # fmt: skip
    rig.round()
    rig.bind(web("web-0", "2"))
    rig.round()
    assert rig.get("once")["status"]["phase"] == "Succeeded"
    rig.now += DAY + 1  # the default retention
    rig.round()
    assert "once" not in rig.api.reservations
    assert rig.get("kept")["status"]["phase"] == "Available"


# -- the controller's death reaches /healthz -------------------------------------------------------


class _Elector:
    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()


class _Dying:
    """A controller whose loop raises at once (a bug, or an error its loop does not catch)."""

    async def run(self, stop: asyncio.Event) -> None:
        raise RuntimeError("boom")


class _Living:
    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()


async def test_the_controllers_death_fails_healthz() -> None:
    """The probe app ``scheduler-ext serve`` runs, with the liveness it wires: the watches' and
    the controller's (``all_of``)."""
    controller = ControllerTask(_Elector(), _Dying())  # type: ignore[arg-type]
    app = create_health_app(ClusterState(), all_of(lambda: (True, "ok"), controller.liveness))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ext") as client:
        assert (await client.get("/healthz")).status_code == 200
        controller.start()
        deadline = asyncio.get_running_loop().time() + 30
        while (resp := await client.get("/healthz")).status_code == 200:  # poll, never sleep a guess
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        assert resp.status_code == 503 and "reservation controller ended: RuntimeError: boom" in resp.text
        await controller.stop()


def test_a_living_controller_keeps_healthz_ok() -> None:
    task = ControllerTask(_Elector(), _Living())  # type: ignore[arg-type]
    assert task.liveness() == (True, "ok")  # not started yet

    async def scenario() -> None:
        task.start()
        for _ in range(20):
            await asyncio.sleep(0)
        assert task.liveness() == (True, "ok")
        await task.stop()
        assert task.liveness() == (True, "ok")  # stopped with the app: not a death

    asyncio.run(scenario())


def test_a_dead_elector_fails_liveness_too() -> None:
    class Dead(_Elector):
        async def run(self, stop: asyncio.Event) -> None:
            return None

    task = ControllerTask(Dead(), _Living())  # type: ignore[arg-type]

    async def scenario() -> None:
        task.start()
        for _ in range(20):
            await asyncio.sleep(0)
        alive, why = task.liveness()
        assert not alive and "reservation lease elector ended: returned" in why
        await task.stop()

    asyncio.run(scenario())


def test_unreadable_conditions_are_refused_by_the_parser() -> None:
    with pytest.raises(FormatError):
        read_conditions({"conditions": [{"type": "Ready", "lastTransitionTime": "yesterday"}]})
