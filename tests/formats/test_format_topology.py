"""``CPUTopology`` and the ``node.koordinator.sh/cpu-topology`` annotation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from koord_formats import CPUInfo, CPUTopology, FormatError, topology
from tests.formats.hostile import HOLE, call_total, fill, fragments

TWO_CORES_HT = (
    '{"detail":[{"id":0,"core":0,"socket":0,"node":0},{"id":1,"core":1,"socket":0,"node":0},'
    '{"id":2,"core":0,"socket":0,"node":0},{"id":3,"core":1,"socket":0,"node":0}]}'
)


def test_parse_builds_the_derived_sets() -> None:
    topo = topology.parse_cpu_topology(TWO_CORES_HT)
    assert topo.cpus == frozenset({0, 1, 2, 3})
    assert topo.core_cpus == (frozenset({0, 2}), frozenset({1, 3}))
    assert topo.cpus_per_core == 2
    assert topo.numa_nodes == (0,)
    assert topo.free_cores(frozenset({0, 1, 2})) == [0]


def test_core_ids_repeated_across_sockets_are_distinct_cores() -> None:
    topo = CPUTopology([CPUInfo(0, 0, 0, 0), CPUInfo(1, 0, 1, 1)])
    assert topo.core_of[0] != topo.core_of[1]
    assert topo.numa_socket == {0: 0, 1: 1}


def test_round_trip_through_the_formatter() -> None:
    topo = topology.parse_cpu_topology(TWO_CORES_HT)
    assert topology.parse_cpu_topology(topology.format_cpu_topology(topo)) == topo


def test_equal_topologies_hash_equal() -> None:
    a = CPUTopology([CPUInfo(1, 0, 0, 0), CPUInfo(0, 0, 0, 0)])
    b = CPUTopology([CPUInfo(0, 0, 0, 0), CPUInfo(1, 0, 0, 0)])
    assert a == b and hash(a) == hash(b)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param('{"detail":[{"id":0,"core":0},{"id":0,"core":1}]}', "twice", id="a CPU listed twice"),
        pytest.param('{"detail":[]}', "empty", id="an empty detail list"),
        pytest.param('{"detail":{}}', "list", id="detail is not a list"),
        pytest.param('{"detail":[{"id":"0","core":0}]}', "integer", id="an id given as a string"),
        pytest.param('{"detail":[{"id":true,"core":0}]}', "integer", id="an id given as a bool"),
        pytest.param('{"detail":[{"id":0.5,"core":0}]}', "integer", id="an id given as a float"),
        pytest.param('{"detail":[{"id":99999,"core":0}]}', "outside", id="an id above the limit"),
        pytest.param('{"detail":[{"id":0}]}', "integer", id="a row without a core"),
        pytest.param("[" * 3000, "nested", id="deep nesting"),
        pytest.param("[]", "object", id="not an object"),
    ],
)
def test_parse_refuses(text: str, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        topology.parse_cpu_topology(text)


def test_constructor_refuses_duplicates() -> None:
    with pytest.raises(FormatError, match="twice"):
        CPUTopology([CPUInfo(0, 0, 0, 0), CPUInfo(0, 1, 0, 0)])


def test_too_many_cpus_are_refused_before_building() -> None:
    rows = [{"id": i, "core": i, "socket": 0, "node": 0} for i in range(topology.MAX_TOPOLOGY_CPUS + 1)]
    with pytest.raises(FormatError, match="items"):
        topology.cpu_topology_from_json({"detail": rows})


def test_largest_topology_parses_within_the_bound() -> None:
    rows = [
        {"id": i, "core": i // 2, "socket": i // 2048, "node": i // 1024} for i in range(topology.MAX_TOPOLOGY_CPUS)
    ]
    topo = call_total(topology.parse_cpu_topology, json.dumps({"detail": rows}))
    assert topo is not None and len(topo.cpus) == topology.MAX_TOPOLOGY_CPUS


TEMPLATES = [
    HOLE,
    '{"detail":HOLE}',
    '{"detail":[HOLE]}',
    '{"detail":[{"id":HOLE,"core":0,"socket":0,"node":0}]}',
    '{"detail":[{"id":0,"core":HOLE,"socket":0,"node":0}]}',
    '{"detail":[{"id":0,"core":0,"socket":HOLE,"node":HOLE}]}',
]


@settings(max_examples=300, deadline=None)
@given(fragment=fragments, template=st.sampled_from(TEMPLATES))
def test_parse_cpu_topology_is_total_and_bounded(template: str, fragment: str) -> None:
    result = call_total(topology.parse_cpu_topology, fill(template, fragment))
    assert result is None or isinstance(result, CPUTopology)
