"""``hooks.plan``: merging plans in plugin order, claims and conflicts (NRI's field ownership)."""

from __future__ import annotations

import pytest

from hooks.plan import CgroupWrite, MergeResult, Plan, PlanError, ResourceChanges, Skip, merge, plan_from_json


def _shares(n: int) -> Plan:
    return Plan().set_resource("cpu_shares", n)


# Each row: the (plugin, plan) pairs in order, the merged CRI part, the plugins left out and the
# conflicting fields.
MERGES = [
    pytest.param([("a", _shares(2)), ("b", Plan().set_env("K", "v"))],
                 {"resources": {"cpu_shares": 2}, "envs": {"K": "v"}}, [], [],
                 id="plans that touch different fields are both kept"),
    pytest.param([("a", _shares(2)), ("b", _shares(2))], {"resources": {"cpu_shares": 2}}, [], [],
                 id="two plugins agreeing on a value is no conflict"),
    pytest.param([("a", _shares(2)), ("b", _shares(3).set_env("K", "v"))], {"resources": {"cpu_shares": 2}},
                 ["b"], ["resources.cpu_shares"],
                 id="a plugin that disagrees on one field loses its whole plan"),
    pytest.param([("a", Plan().set_cgroup_parent("/x")), ("b", Plan().set_cgroup_parent("/y"))],
                 {"cgroupParent": "/x"}, ["b"], ["cgroupParent"],
                 id="the cgroup parent is claimed by the first plugin that sets it"),
    pytest.param([("a", None), ("b", Plan().set_label("l", "1"))], {"labels": {"l": "1"}}, [], [],
                 id="None means no opinion"),
    pytest.param([("a", Plan().set_annotation("k", "1")), ("b", Plan().set_annotation("k", "2")),
                  ("c", Plan().set_annotation("j", "3"))],
                 {"annotations": {"k": "1", "j": "3"}}, ["b"], ["annotations.k"],
                 id="plugins after a conflict still merge"),
]


@pytest.mark.parametrize(("plans", "cri", "rejected", "fields"), MERGES)
def test_merge(plans: list[tuple[str, Plan | None]], cri: dict[str, object], rejected: list[str],
               fields: list[str]) -> None:
    result = merge(plans)
    assert result.plan.cri_json() == cri
    assert result.rejected == rejected
    assert [c.field for c in result.conflicts] == fields


def test_conflicting_writes_to_one_file_name_both_plugins_and_values() -> None:
    result = MergeResult()
    assert result.add("a", Plan().write("pod", "p", "cpu.shares", 2)) == []
    [conflict] = result.add("b", Plan().write("pod", "p", "cpu.shares", 3))
    assert (conflict.first, conflict.second, conflict.first_value, conflict.second_value) == ("a", "b", "2", "3")
    assert "'a'" in str(conflict) and "'b'" in str(conflict)
    assert result.plan.writes == [CgroupWrite("pod", "p", "cpu.shares", "2")]


def test_a_plan_left_out_for_a_conflict_claims_nothing() -> None:
    result = MergeResult()
    assert result.add("a", Plan().set_resource("cpu_shares", 2)) == []
    # b conflicts on cpu_shares: its claim on cpu_quota is not kept, so c's value for it merges.
    [conflict] = result.add("b", Plan().set_resource("cpu_quota", 5).set_resource("cpu_shares", 3))
    assert (conflict.field, conflict.first, conflict.second) == ("resources.cpu_shares", "a", "b")
    assert result.add("c", Plan().set_resource("cpu_quota", 7)) == []
    assert result.plan.cri_json() == {"resources": {"cpu_shares": 2, "cpu_quota": 7}}
    assert result.owners == {"resources.cpu_shares": "a", "resources.cpu_quota": "c"}
    assert result.rejected == ["b"]


def test_equal_writes_are_kept_once_and_skips_name_their_plugin() -> None:
    result = merge([("a", Plan().write("pod", "p", "f", 1).skip("why")), ("b", Plan().write("pod", "p", "f", 1))])
    assert result.plan.writes == [CgroupWrite("pod", "p", "f", "1")]
    assert result.plan.skipped == [Skip("why", "a")]
    assert result.owners["write:pod:p:f"] == "a"


@pytest.mark.parametrize(
    ("level", "file"),
    [
        pytest.param("nowhere", "cpu.shares", id="an unknown level is refused"),
        pytest.param("pod", "../escape", id="a file name with a slash is refused"),
        pytest.param("pod", "", id="an empty file name is refused"),
    ],
)
def test_bad_writes_are_refused_when_planned(level: str, file: str) -> None:
    with pytest.raises(ValueError):
        Plan().write(level, "p", file, 1)


def test_plan_round_trips_through_json() -> None:
    plan = (Plan().set_resource("cpu_quota", -1).set_env("A", "1").set_annotation("k", "v").set_label("l", "w")
            .set_cgroup_parent("/x").write("pod", "p", "cpu.shares", 2).move_tasks("container", "p/c", "BE")
            .remove("resctrl", "koordlet-u").skip("because"))
    assert plan_from_json(plan.to_json()) == plan
    assert not plan.is_empty() and Plan().skip("only a skip").is_empty()


# ---- ResourceChanges: one shape per field -------------------------------------------------------

HUGEPAGES = (("2MB", 1 << 21), ("1GB", 0))


@pytest.mark.parametrize(
    "given",
    [
        pytest.param([{"page_size": "2MB", "limit": 1 << 21}, {"page_size": "1GB", "limit": 0}],
                     id="hugepage limits in their JSON shape are kept as pairs"),
        pytest.param(list(HUGEPAGES), id="hugepage limits given as pairs stay pairs"),
        pytest.param(iter(HUGEPAGES), id="hugepage limits from any iterable of pairs"),
    ],
)
def test_hugepage_limits_have_one_shape(given: object) -> None:
    plan = Plan().set_resource("hugepage_limits", given)  # type: ignore[call-overload]
    assert plan.resources.hugepage_limits == HUGEPAGES
    assert plan.resources["hugepage_limits"] == HUGEPAGES
    assert plan.cri_json() == {"resources": {"hugepage_limits": [
        {"page_size": "2MB", "limit": 1 << 21}, {"page_size": "1GB", "limit": 0}]}}
    assert plan_from_json(plan.to_json()) == plan


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param("no_such_field", 1, id="an unknown field"),
        pytest.param("cpu_shares", "2", id="a string for a number"),
        pytest.param("cpu_quota", True, id="a bool for a number"),
        pytest.param("cpuset_cpus", 3, id="a number for a cpuset"),
        pytest.param("unified", ["a"], id="a list for unified"),
        pytest.param("hugepage_limits", [("2MB", -1)], id="a negative hugepage limit"),
        pytest.param("hugepage_limits", [{"page_size": 2, "limit": 1}], id="a hugepage size that is no string"),
    ],
)
def test_a_resource_of_the_wrong_shape_is_refused_when_set(name: str, value: object) -> None:
    with pytest.raises(PlanError):
        Plan().set_resource(name, value)  # type: ignore[call-overload]


def test_resource_changes_read_as_a_mapping_of_the_changed_fields_in_proto_order() -> None:
    changes = Plan().set_resource("cpuset_cpus", "").set_resource("cpu_shares", 2).set_resource(
        "unified", {"memory.high": "max"}).resources
    assert list(changes) == ["cpu_shares", "cpuset_cpus", "unified"]
    assert changes == {"cpu_shares": 2, "cpuset_cpus": "", "unified": {"memory.high": "max"}}
    assert (changes.cpu_shares, changes.cpu_quota, "cpu_quota" in changes, changes.get("cpu_quota")) == (
        2, None, False, None)
    assert ResourceChanges(cpu_shares=2).merged({"cpu_shares": 3, "cpu_period": 1}) == {"cpu_shares": 3,
                                                                                         "cpu_period": 1}
    with pytest.raises(PlanError):
        ResourceChanges(cpu_shares="2")  # type: ignore[arg-type]


def test_a_plan_made_with_a_plain_resource_mapping_holds_resource_changes() -> None:
    plan = Plan(resources={"cpu_quota": -1})  # type: ignore[arg-type]
    assert isinstance(plan.resources, ResourceChanges) and plan.resources.cpu_quota == -1


def test_the_file_part_of_a_plan_is_its_writes_moves_and_removals_alone() -> None:
    plan = (Plan().set_resource("cpu_shares", 2).set_env("A", "1").set_annotation("a", "b")
            .write("pod", "kubepods/pod1", "cpu.shares", 2).move_tasks("container", "c/", "g").remove("resctrl", "g")
            .evict("u", "ns", "n", "BECPUEvict", "why").skip("nothing"))
    files = plan.files()
    assert files.to_json() == {"cri": {}, "writes": [w.to_json() for w in plan.writes],
                               "moves": [m.to_json() for m in plan.moves],
                               "removals": [r.to_json() for r in plan.removals], "skipped": []}
    assert files.writes is not plan.writes and files.moves is not plan.moves
    other = [CgroupWrite("pod", "kubepods/pod2", "cpu.shares", "4")]
    assert plan.files(other).writes == other and plan.files(other).moves == plan.moves
    assert plan.files([]).writes == [] and not Plan().files().writes
