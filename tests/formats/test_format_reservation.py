"""Reservations: the Reservation object's scheduling parts, reservation-affinity and
reservation-allocated (``koord_formats/reservation.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import FormatError, keys, reservation
from tests.formats.hostile import HOLE, call_total, fill, fragments

FULL = {
    "apiVersion": "scheduling.koordinator.sh/v1alpha1",
    "kind": "Reservation",
    "metadata": {
        "name": "r1",
        "uid": "u1",
        "labels": {"pool": "a"},
        "annotations": {keys.ANNOTATION_RESOURCE_STATUS: '{"cpuset":"0-3","numaNodeResources":[{"node":0,'
                                                         '"resources":{"cpu":"4","memory":"8Gi"}}]}'},
    },
    "spec": {
        "template": {"metadata": {"annotations": {
            keys.ANNOTATION_RESOURCE_SPEC: '{"preferredCPUExclusivePolicy":"PCPULevel"}'}}, "spec": {}},
        "owners": [
            {"object": {"name": "web", "namespace": "default", "apiVersion": "v1"}},
            {"controller": {"kind": "ReplicaSet", "name": "web-1", "uid": "rs", "controller": True,
                            "namespace": "prod"}},
            {"labelSelector": {"matchLabels": {"app": "web"}, "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]}]}},
        ],
        "ttl": "1h",
        "allocateOnce": False,
        "allocatePolicy": "Restricted",
        "unschedulable": True,
        "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}],
    },
    "status": {"phase": "Available", "nodeName": "n1", "allocatable": {"cpu": "4", "memory": "8Gi"},
               "allocated": {"cpu": "1"}},
}


def test_a_reservation_as_koord_scheduler_reads_it() -> None:
    r = reservation.parse_reservation(FULL)
    assert (r.name, r.uid, r.phase, r.node_name) == ("r1", "u1", "Available", "n1")
    assert r.available and r.active and r.valid
    assert dict(r.labels) == {"pool": "a"}
    assert r.status.cpuset == frozenset({0, 1, 2, 3})
    assert r.exclusive_policy == "PCPULevel"  # the template's resource-spec, under the reservation's own
    assert (r.allocate_once, r.allocate_policy, r.unschedulable) == (False, "Restricted", True)
    assert r.taints == (reservation.Taint("k", "v", "NoSchedule"),)
    assert r.allocatable["memory"] == Fraction(8 << 30) and r.allocated["cpu"] == Fraction(1)
    obj, ctl, sel = r.owners
    assert obj.object == reservation.ObjectRef(name="web", namespace="default", api_version="v1")
    assert ctl.controller == reservation.OwnerRef(uid="rs", name="web-1", kind="ReplicaSet", controller=True,
                                                  namespace="prod")
    assert sel.label_selector is not None
    assert sel.label_selector.match_expressions == (reservation.LabelRequirement("tier", "In", ("a", "b")),)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param({}, (True, True), id="defaults: allocate-once, Default policy, valid"),
        pytest.param({"spec": {"owners": [{}], "template": {}}}, (True, False),
                     id="no ttl and no expires is not valid"),
        pytest.param({"spec": {"owners": [], "template": {}, "ttl": "1h"}}, (True, False),
                     id="no owners is not valid"),
        pytest.param({"spec": {"owners": [{}], "ttl": "1h"}}, (True, False), id="no template is not valid"),
    ],
)
def test_reservation_defaults_and_validity(change: dict[str, Any], expected: tuple[bool, bool]) -> None:
    doc: dict[str, Any] = {"metadata": {"name": "r", "uid": "u"},
                           "spec": {"owners": [{}], "template": {}, "ttl": "1h"}}
    doc.update(change)
    r = reservation.parse_reservation(doc)
    assert (r.allocate_once, r.valid) == expected
    assert r.allocate_policy == keys.RESERVATION_ALLOCATE_POLICY_DEFAULT


def test_reservation_affinity_as_the_pod_writes_it() -> None:
    aff = reservation.parse_reservation_affinity(json.dumps({
        "requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "Exists"}],
             "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["r1"]}]}]},
        "reservationSelector": {"pool": "a"},
        "name": "r1",
        "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
    }))
    assert aff.name == "r1" and dict(aff.selector) == {"pool": "a"}
    assert aff.terms is not None and aff.terms[0].match_fields[0].values == ("r1",)
    assert aff.tolerations == (reservation.Toleration("k", "Exists", "", "NoSchedule"),)
    assert reservation.parse_reservation_affinity("") == reservation.ReservationAffinity()


def test_reservation_allocated_round_trips() -> None:
    text = reservation.format_reservation_allocated("r1", "u1")
    assert text == '{"name":"r1","uid":"u1"}'
    assert reservation.parse_reservation_allocated(text) == reservation.ReservationAllocated("r1", "u1")


ANNOTATION_PARSERS: list[Any] = [
    pytest.param(
        reservation.parse_reservation_affinity,
        [
            HOLE,
            '{"name":HOLE}',
            '{"reservationSelector":HOLE}',
            '{"tolerations":[HOLE]}',
            '{"requiredDuringSchedulingIgnoredDuringExecution":{"reservationSelectorTerms":HOLE}}',
            '{"requiredDuringSchedulingIgnoredDuringExecution":{"reservationSelectorTerms":[{"matchExpressions":'
            '[{"key":"k","operator":HOLE,"values":HOLE}]}]}}',
        ],
        id="reservation-affinity",
    ),
    pytest.param(reservation.parse_reservation_allocated, [HOLE, '{"name":HOLE,"uid":HOLE}'],
                 id="reservation-allocated"),
]


@pytest.mark.parametrize(("parse", "templates"), ANNOTATION_PARSERS)
@settings(max_examples=200, deadline=None)
@given(data=st.data(), fragment=fragments)
def test_reservation_annotation_parsers_are_total_and_bounded(
    parse: Callable[[str], object], templates: list[str], data: st.DataObject, fragment: str
) -> None:
    call_total(parse, fill(data.draw(st.sampled_from(templates)), fragment))


OBJECT_TEMPLATES = [
    HOLE,
    '{"metadata":HOLE}',
    '{"metadata":{"name":"r","uid":"u","labels":HOLE}}',
    '{"metadata":{"name":"r","uid":"u","annotations":{"scheduling.koordinator.sh/resource-status":HOLE}}}',
    '{"metadata":{"name":"r","uid":"u"},"spec":{"owners":[HOLE]}}',
    '{"metadata":{"name":"r","uid":"u"},"spec":{"owners":[{"labelSelector":HOLE}]}}',
    '{"metadata":{"name":"r","uid":"u"},"spec":{"allocateOnce":HOLE,"allocatePolicy":HOLE,"taints":HOLE}}',
    '{"metadata":{"name":"r","uid":"u"},"status":{"phase":HOLE,"nodeName":HOLE,"allocatable":HOLE}}',
]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), fragment=fragments)
def test_the_reservation_parser_is_total_and_bounded(data: st.DataObject, fragment: str) -> None:
    text = fill(data.draw(st.sampled_from(OBJECT_TEMPLATES)), fragment)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return  # the watch skips what is not JSON before any parser sees it
    call_total(reservation.parse_reservation, obj)


def test_a_reservation_without_a_uid_is_refused() -> None:
    with pytest.raises(FormatError):
        reservation.parse_reservation({"metadata": {"name": "r"}})


# ---- one parser, two sets of bounds (the reservation template's reader shares these) ----------------


def _affinity_term(value: str) -> str:
    return json.dumps({"requiredDuringSchedulingIgnoredDuringExecution": {"reservationSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": [value]}]}]}})


def _template_terms(value: str) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": [value]}]}]}}}}


def test_a_template_term_keeps_its_longer_string_bound() -> None:
    """reservation-affinity reads label strings up to 320 characters, a Reservation template's
    nodeSelectorTerms (``reservation_spec``) up to 1024, through the same term parser."""
    from koord_formats.reservation_spec import parse_pod_constraints

    long = "v" * 500
    with pytest.raises(FormatError):
        reservation.parse_reservation_affinity(_affinity_term(long))
    terms = parse_pod_constraints(_template_terms(long)).terms
    assert terms is not None and terms[0].matches({"k": long}, "n") and not terms[0].matches({"k": "v"}, "n")
    with pytest.raises(FormatError):
        parse_pod_constraints(_template_terms("v" * 1025))


def test_one_toleration_rule_for_the_affinity_and_the_template() -> None:
    taint = reservation.Taint("dedicated", "db", "NoSchedule")
    assert reservation.Toleration("dedicated", "Equal", "db", "NoSchedule").tolerates(taint)
    assert reservation.Toleration("dedicated", "Exists").tolerates(taint)
    assert reservation.Toleration("", "Exists").tolerates(taint)
    assert not reservation.Toleration("dedicated", "Equal", "web").tolerates(taint)
    assert not reservation.Toleration("dedicated", "Exists", "", "NoExecute").tolerates(taint)
