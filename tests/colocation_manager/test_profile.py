"""The pod webhook's decisions (``colocation_manager.profile``): ClusterColocationProfile
mutation, one row per rule of Koordinator's webhook with its description, the validation rules,
the profile parser (``koord_formats.profile``), and hostile pods and profiles."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from colocation_manager.profile import PriorityClassInfo, mutate_pod, validate_pod
from koord_formats import FormatError, keys
from koord_formats.pod import parse_extended_resource_spec
from koord_formats.profile import ColocationProfile, parse_profile
from tests.formats.hostile import FRAGMENTS, call_total, fill

BATCH_CPU, BATCH_MEM = keys.RESOURCE_BATCH_CPU, keys.RESOURCE_BATCH_MEMORY
CLASSES = {"koord-batch": PriorityClassInfo(5000, "Never"), "koord-mid": PriorityClassInfo(7000),
           "koord-prod": PriorityClassInfo(9000)}


def profile(**spec: Any) -> ColocationProfile:
    meta = spec.pop("metadata", {"name": spec.pop("name", "p")})
    return parse_profile({"metadata": meta, "spec": spec})


BE_PROFILE = dict(selector={"matchLabels": {"app": "spark"}}, qosClass="BE", priorityClassName="koord-batch",
                  koordinatorPriority=1111, schedulerName="koord-scheduler", labels={"colocated": "true"},
                  annotations={"note": "made BE"})


def pod(requests: dict[str, str] | None = None, limits: dict[str, str] | None = None, *,
        labels: dict[str, str] | None = None, init: dict[str, str] | None = None,
        overhead: dict[str, str] | None = None, priority: int | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "x", "resources": res}]}
    if init is not None:
        spec["initContainers"] = [{"name": "init", "image": "x", "resources": {"requests": init}}]
    if overhead is not None:
        spec["overhead"] = overhead
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"namespace": "ns", "generateName": "spark-", "labels": labels or {"app": "spark"}},
            "spec": spec}


def apply_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 "add" operations on object members (all the webhook returns)."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for part in parts[:-1]:
            target = target[part]
        target[parts[-1]] = op["value"]
    return out


def mutated(obj: dict[str, Any], profiles: list[ColocationProfile], *, ns_labels: dict[str, str] | None = None,
            roll: int = 0) -> dict[str, Any]:
    m = mutate_pod(obj, ns_labels or {}, profiles, CLASSES, lambda: roll)
    assert not m.error, m.error
    return apply_patch(obj, list(m.patch))


def resources(obj: dict[str, Any], container: str = "containers") -> dict[str, Any]:
    res: dict[str, Any] = obj["spec"][container][0]["resources"]
    return res


@pytest.mark.parametrize(
    ("description", "before", "requests", "limits"),
    [
        ("'500m' cpu becomes '500' batch-cpu; memory becomes batch-memory as given",
         pod({"cpu": "500m", "memory": "1Gi"}, {"cpu": "500m", "memory": "1Gi"}),
         {BATCH_CPU: "500", BATCH_MEM: "1Gi"}, {BATCH_CPU: "500", BATCH_MEM: "1Gi"}),
        ("whole cores become milli-cores: '2' -> '2000'", pod({"cpu": "2"}, {"cpu": "2"}),
         {BATCH_CPU: "2000"}, {BATCH_CPU: "2000"}),
        ("a limit without a request gets the request", pod(None, {"cpu": "1", "memory": "512Mi"}),
         {BATCH_CPU: "1000", BATCH_MEM: "512Mi"}, {BATCH_CPU: "1000", BATCH_MEM: "512Mi"}),
        ("a fraction of a milli-core rounds up", pod({"cpu": "0.0001"}), {BATCH_CPU: "1"}, {}),
        ("other resources stay", pod({"cpu": "1", "ephemeral-storage": "1Gi"}),
         {BATCH_CPU: "1000", "ephemeral-storage": "1Gi"}, {}),
    ],
)
def test_batch_resource_rewrite(description: str, before: dict[str, Any], requests: dict[str, str],
                                limits: dict[str, str]) -> None:
    after = mutated(before, [profile(**BE_PROFILE)])
    assert resources(after) == {"requests": requests, "limits": limits}, description
    spec = parse_extended_resource_spec(after["metadata"]["annotations"][keys.ANNOTATION_EXTENDED_RESOURCE_SPEC])
    assert {k: str(v) for k, v in spec["app"].requests.items() if k in (BATCH_CPU,)} == \
        ({BATCH_CPU: requests[BATCH_CPU]} if BATCH_CPU in requests else {})


def test_profile_fields_land_on_the_pod() -> None:
    after = mutated(pod({"cpu": "1"}), [profile(**BE_PROFILE)])
    labels = after["metadata"]["labels"]
    assert labels[keys.LABEL_QOS_CLASS] == "BE"
    assert labels[keys.LABEL_PRIORITY] == "1111"
    assert labels["colocated"] == "true"
    assert after["metadata"]["annotations"]["note"] == "made BE"
    assert after["spec"]["schedulerName"] == "koord-scheduler"
    assert (after["spec"]["priorityClassName"], after["spec"]["priority"], after["spec"]["preemptionPolicy"]) == \
        ("koord-batch", 5000, "Never")
    assert validate_pod(after) == [], "the mutated pod passes the validation"


def test_init_containers_and_overhead_are_rewritten_too() -> None:
    after = mutated(pod({"cpu": "1"}, init={"cpu": "250m", "memory": "64Mi"}, overhead={"cpu": "100m"}),
                    [profile(**BE_PROFILE)])
    assert resources(after, "initContainers")["requests"] == {BATCH_CPU: "250", BATCH_MEM: "64Mi"}
    assert after["spec"]["overhead"] == {BATCH_CPU: "100"}
    spec = parse_extended_resource_spec(after["metadata"]["annotations"][keys.ANNOTATION_EXTENDED_RESOURCE_SPEC])
    assert set(spec) == {"app"}, "the annotation records containers, not init containers"


@pytest.mark.parametrize(
    ("description", "profiles", "ns_labels", "roll", "changed"),
    [
        ("a profile whose selector does not match leaves the pod alone",
         [profile(**{**BE_PROFILE, "selector": {"matchLabels": {"app": "web"}}})], {}, 0, False),
        ("a profile whose namespaceSelector does not match leaves the pod alone",
         [profile(**{**BE_PROFILE, "namespaceSelector": {"matchLabels": {"colocation": "on"}}})], {}, 0, False),
        ("a matching namespaceSelector applies",
         [profile(**{**BE_PROFILE, "namespaceSelector": {"matchLabels": {"colocation": "on"}}})],
         {"colocation": "on"}, 0, True),
        ("no selector matches every pod", [profile(qosClass="BE", priorityClassName="koord-batch")], {}, 0, True),
        ("probability 0% never applies", [profile(**{**BE_PROFILE, "probability": "0%"})], {}, 0, False),
        ("a roll above the probability skips", [profile(**{**BE_PROFILE, "probability": "50%"})], {}, 51, False),
        ("a roll at the probability applies", [profile(**{**BE_PROFILE, "probability": 50})], {}, 50, True),
    ],
)
def test_matching(description: str, profiles: list[ColocationProfile], ns_labels: dict[str, str], roll: int,
                  changed: bool) -> None:
    m = mutate_pod(pod({"cpu": "1"}), ns_labels, profiles, CLASSES, lambda: roll)
    assert bool(m.patch) is changed, description


def test_profiles_apply_in_name_order_and_later_ones_win() -> None:
    first = profile(name="a", labels={"tier": "one"}, qosClass="LS")
    second = profile(name="b", labels={"tier": "two"}, qosClass="BE", priorityClassName="koord-batch")
    after = mutated(pod({"cpu": "1"}), [second, first])
    assert after["metadata"]["labels"]["tier"] == "two"
    assert resources(after)["requests"] == {BATCH_CPU: "1000"}


def test_key_mappings_and_suffixes() -> None:
    p = profile(labelKeysMapping={"app": "koordinator.sh/app"}, annotationKeysMapping={"a": "b"},
                labelSuffixes={"app": "-be"}, metadata={"name": "p", "annotations": {
                    "config.koordinator.sh/skip-update-resources": "true"}})
    obj = pod({"cpu": "1"})
    obj["metadata"]["annotations"] = {"a": "x"}
    after = mutated(obj, [p])
    assert after["metadata"]["labels"] == {"app": "spark-be", "koordinator.sh/app": "spark"}
    assert after["metadata"]["annotations"]["b"] == "x"
    assert resources(after)["requests"] == {"cpu": "1"}, "skip-update-resources keeps cpu"


def test_a_mid_pod_gets_mid_resources_and_a_prod_pod_keeps_cpu() -> None:
    mid = mutated(pod({"cpu": "1"}), [profile(priorityClassName="koord-mid")])
    assert resources(mid)["requests"] == {keys.RESOURCE_MID_CPU: "1000"}
    prod = mutated(pod({"cpu": "1"}), [profile(qosClass="LS", priorityClassName="koord-prod")])
    assert resources(prod)["requests"] == {"cpu": "1"}


def test_an_unknown_priority_class_refuses_the_pod() -> None:
    m = mutate_pod(pod({"cpu": "1"}), {}, [profile(priorityClassName="nope")], CLASSES, lambda: 0)
    assert "nope" in m.error and not m.patch


@pytest.mark.parametrize(
    ("description", "obj", "old", "errors"),
    [
        ("batch resources without QoS BE are refused", pod({BATCH_CPU: "500"}), None, ["must specify"]),
        ("batch resources with QoS BE and koord-batch pass",
         pod({BATCH_CPU: "500"}, labels={keys.LABEL_QOS_CLASS: "BE"}, priority=5000), None, []),
        ("BE without a priority class is refused", pod({}, labels={keys.LABEL_QOS_CLASS: "BE"}), None,
         ["priorityClass=none"]),
        ("BE with koord-prod is refused", pod({}, labels={keys.LABEL_QOS_CLASS: "BE"}, priority=9000), None,
         ["priorityClass=koord-prod"]),
        ("LSR with koord-batch is refused",
         pod({"cpu": "1"}, labels={keys.LABEL_QOS_CLASS: "LSR", keys.LABEL_PRIORITY_CLASS: "koord-batch"}), None,
         ["priorityClass=koord-batch"]),
        ("LSR needs whole CPUs", pod({"cpu": "1500m"}, labels={keys.LABEL_QOS_CLASS: "LSR"}, priority=9000), None,
         ["must be an integer"]),
        ("LSE needs CPUs", pod({}, labels={keys.LABEL_QOS_CLASS: "LSE"}, priority=9000), None,
         ["must declare"]),
        ("a plain pod passes", pod({"cpu": "1"}), None, []),
        ("the QoS label cannot change on update", pod({}, labels={keys.LABEL_QOS_CLASS: "LS"}, priority=5000),
         pod({}, labels={keys.LABEL_QOS_CLASS: "BE"}, priority=5000), ["immutable"]),
        ("the priority class cannot change on update", pod({}, priority=9000), pod({}, priority=5000),
         ["immutable"]),
        ("the priority label cannot change on update", pod({}, labels={keys.LABEL_PRIORITY: "2"}),
         pod({}, labels={keys.LABEL_PRIORITY: "1"}), ["immutable"]),
        ("an unreadable pod is refused with the reason", {"metadata": {"labels": {"a": 1}}}, None,
         ["cannot be read"]),
    ],
)
def test_validate(description: str, obj: dict[str, Any], old: dict[str, Any] | None, errors: list[str]) -> None:
    got = validate_pod(obj, old)
    assert len(got) == len(errors), (description, got)
    for text, want in zip(got, errors, strict=True):
        assert want in text, (description, got)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"qosClass": "GOLD"}, id="an unknown QoS class"),
        pytest.param({"patch": {"spec": {"hostNetwork": True}}}, id="a patch, which is not supported"),
        pytest.param({"probability": "half"}, id="a probability that is not an integer or a percentage"),
        pytest.param({"labels": {"a": 1}}, id="a label value that is a number"),
        pytest.param({"labels": {str(i): "x" for i in range(100)}}, id="too many labels"),
        pytest.param({"koordinatorPriority": "high"}, id="a koordinatorPriority that is a string"),
    ],
)
def test_profile_refuses(spec: dict[str, Any]) -> None:
    with pytest.raises(FormatError):
        parse_profile({"metadata": {"name": "p"}, "spec": spec})


def test_a_profile_with_a_bad_selector_matches_every_pod_and_says_so() -> None:
    p = parse_profile({"metadata": {"name": "p"}, "spec": {"selector": {"matchExpressions": [{"key": "a"}]}}})
    assert p.selector is None and p.problems


@pytest.mark.parametrize("template", [
    '{"metadata":{"labels":HOLE},"spec":{"containers":[]}}',
    '{"metadata":{},"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":HOLE}}}]}}',
    '{"metadata":{},"spec":{"containers":[{"name":"app","resources":{"limits":HOLE}}]}}',
    '{"metadata":{},"spec":{"containers":HOLE}}',
    '{"metadata":{},"spec":{"overhead":HOLE,"containers":[]}}',
])
def test_hostile_pods(template: str) -> None:
    """Every hostile fragment in the pod: a mutation or an error for that pod, never an exception."""
    p = profile(qosClass="BE", priorityClassName="koord-batch")
    for fragment in FRAGMENTS:
        try:
            obj = json.loads(fill(template, fragment))
        except (ValueError, RecursionError):
            continue
        m = call_total(mutate_pod, obj, {}, [p], CLASSES, lambda: 0)
        assert m is not None
        call_total(validate_pod, obj, None)
        if m.patch:
            base64.b64encode(json.dumps(list(m.patch)).encode())


@pytest.mark.parametrize("template", ['{"metadata":{"name":"p"},"spec":HOLE}',
                                      '{"metadata":{"name":"p"},"spec":{"selector":HOLE}}',
                                      '{"metadata":{"name":"p"},"spec":{"probability":HOLE}}'])
def test_hostile_profiles(template: str) -> None:
    for fragment in FRAGMENTS:
        try:
            obj = json.loads(fill(template, fragment))
        except (ValueError, RecursionError):
            continue
        call_total(parse_profile, obj)
