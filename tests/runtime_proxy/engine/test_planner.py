"""``runtime-proxy plan``: documents in, plans out (no root, no I/O on the node)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime_proxy.commands.plan import main
from runtime_proxy.engine.planner import PlanInputError, plan_document

TOPO = {"detail": [{"id": i, "core": i % 4, "socket": i // 4 % 2, "node": i // 4 % 2} for i in range(8)]}
RS = "scheduling.koordinator.sh/resource-status"
EXAMPLES = Path(__file__).resolve().parents[3] / "packaging" / "examples"


def doc(stage: str, **overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "stage": stage,
        "pod": {"name": "web", "namespace": "default", "uid": "u1", "labels": {"koordinator.sh/qosClass": "LS"},
                "annotations": {}, "cgroupParent": "/kubepods/burstable/podu1"},
        "container": {"name": "app", "resources": {"cpu_period": 100000, "cpu_quota": 200000, "cpu_shares": 2048}},
        "node": {"cpuTopology": TOPO, "boundCPUs": {"lsr": "0-1"}},
        "nodeSLO": {},
    }
    base.update(overrides)
    return base


@pytest.mark.parametrize(
    ("document", "key", "expected"),
    [
        pytest.param(doc("PreCreateContainer"), "cri",
                     {"resources": {"cpuset_cpus": "2-7"},
                      "annotations": {"runtimeproxy.koordinator.sh/cpu-quota-normalization": "200000/200000"}},
                     id="LS container gets the share pool minus bound CPUs and its quota recorded"),
        pytest.param(doc("PreCreateContainer", pod={"uid": "u2", "labels": {"koordinator.sh/qosClass": "LSR"},
                                                      "annotations": {RS: '{"cpuset":"0-1"}'},
                                                      "cgroupParent": "/kubepods/podu2"},
                         node={"cpuTopology": TOPO, "boundCPUs": {"u2": "0-1"}}),
                     "cri", {"resources": {"cpuset_cpus": "0-1", "cpu_quota": -1}}, id="LSR container is bound"),
        pytest.param(doc("PreCreateContainer", pod={"uid": "u2", "labels": {"koordinator.sh/qosClass": "LSR"},
                                                      "annotations": {RS: '{"cpuset":"0-1"}'},
                                                      "cgroupParent": "/kubepods/podu2"}),
                     "cri", {"resources": {"cpuset_cpus": "2-7"}},
                     id="an LSR container claiming CPUs another pod holds is not bound and keeps its quota"),
        pytest.param(doc("PreRunPodSandbox", pod={"uid": "u2", "labels": {"koordinator.sh/qosClass": "LSR"},
                                                    "annotations": {RS: '{"cpuset":"0-1"}'},
                                                    "cgroupParent": "/kubepods/podu2"},
                         node={"cpuTopology": TOPO, "boundCPUs": {"u2": "0-1"}}),
                     "writes", [{"level": "pod", "path": "kubepods/podu2", "file": "cpu.cfs_quota_us", "value": "-1"}],
                     id="LSR sandbox gets its pod quota unset"),
        pytest.param(doc("PreCreateContainer", plugins=["numa"]), "cri", {}, id="plugins limits what runs"),
        pytest.param(doc("PostStopContainer"), "cri", {}, id="a stage without plugins plans nothing"),
        pytest.param(doc("PreCreateContainer", pod={"labels": {"koordinator.sh/qosClass": "LSR"},
                                                      "annotations": {RS: '{"cpuset":"0-"}'},
                                                      "cgroupParent": "/kubepods/podu2"}),
                     "skipped", [{"plugin": p, "reason": "pod /: bad resource-status: bad CPU list element '0-'"}
                                 for p in ("cpuset", "numa")],
                     id="malformed annotation is skipped, not an error"),
    ],
)
def test_plan_document(document: dict[str, Any], key: str, expected: Any) -> None:
    assert plan_document(document)[key] == expected


def test_reconcile_stage_runs_node_pod_and_container_hooks() -> None:
    slo = {"resourceQOSStrategy": {"lsClass": {"cpuQOS": {"enable": True}}}}
    out = plan_document(doc("Reconcile", nodeSLO=slo))
    levels = {(w["level"], w["file"]) for w in out["writes"]}
    assert ("kubeqos", "cpu.bvt_warp_ns") in levels and ("pod", "cpu.bvt_warp_ns") in levels
    assert out["cri"] == {"resources": {"cpuset_cpus": "2-7"}}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param({"stage": "Nope"}, "unknown stage", id="unknown stage"),
        pytest.param({"pod": {}}, "^the document names no stage: add \"stage\"", id="no stage is named as missing"),
        pytest.param({"stage": None}, "^the document names no stage", id="a null stage is named as missing"),
        pytest.param(doc("PreCreateContainer", container=None), "needs a container", id="container missing"),
        pytest.param(doc("PreCreateContainer", plugins=["nope"]), "unknown plugins", id="unknown plugin"),
        pytest.param(doc("PreCreateContainer", pod={"labels": {"a": 1}}), "pod.labels.a: must be a string",
                     id="label of wrong type"),
        pytest.param(doc("PreCreateContainer", container={"resources": {"cpu_quota": "x"}}), "integer",
                     id="resource of wrong type"),
        pytest.param(doc("PreCreateContainer", node={"cpuTopology": {"detail": 5}}), "cpuTopology",
                     id="bad topology"),
        pytest.param([], "JSON object", id="not an object"),
        pytest.param(doc("ReconcileCpuBurst"), "runs only in the CPU burst loop", id="a loop's own stage"),
        pytest.param(doc("ReconcileResctrlGroups"), "runs only in the reconciler", id="the reconciler's own stage"),
    ],
)
def test_bad_documents_are_errors(document: Any, message: str) -> None:
    with pytest.raises(PlanInputError, match=message):
        plan_document(document)


def test_main_reads_stdin_and_prints_json(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(doc("PreCreateContainer"))))
    assert main(["--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["cri"]["resources"]["cpuset_cpus"] == "2-7"


def test_main_prints_readable_text_by_default(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(doc("PreCreateContainer"))))
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("stage:   PreCreateContainer\n")
    assert 'resources = {"cpuset_cpus": "2-7"' in out and "conflicts: none" in out


def _with_resources(resources: Any) -> str:
    return json.dumps(doc("PreCreateContainer", container={"name": "c", "resources": resources}))


# Each row: the input text and a word the one-line message on stderr must contain.
BAD_INPUTS = [
    pytest.param("{", "not valid JSON", id="a truncated document is not JSON"),
    pytest.param("", "not valid JSON", id="an empty input is not JSON"),
    pytest.param(json.dumps({"stage": ["x"]}), "unknown stage", id="a list as the stage names no stage"),
    pytest.param(json.dumps({"stage": {"a": 1}}), "unknown stage", id="an object as the stage names no stage"),
    pytest.param("[" * 100_000, "nested", id="one hundred thousand open brackets are too deep"),
    pytest.param('{"stage":"PreCreateContainer","pod":' * 40 + "{}" + "}" * 40, "nested",
                 id="forty nested documents are too deep"),
    pytest.param(_with_resources({"hugepage_limits": [{"page_size": "2MB", "limit": 10**30}]}), "digits",
                 id="a hugepage limit of thirty digits is refused"),
    pytest.param(_with_resources({"hugepage_limits": [{"page_size": "2MB", "limit": 1e300}]}).replace("e+300", "e400"),
                 "out of range", id="a hugepage limit of 1e400 overflows and is refused"),
    pytest.param(_with_resources({"hugepage_limits": 5}), "resources", id="hugepage limits that are not a list"),
    pytest.param(_with_resources({"hugepage_limits": [5]}), "resources", id="a hugepage limit that is not an object"),
    pytest.param(_with_resources({"cpu_shares": "many"}), "integer", id="a string where an integer belongs"),
    pytest.param(json.dumps(doc("PreCreateContainer", pod=5)), "pod: must be an object", id="a number as the pod"),
    pytest.param(json.dumps(doc("PreCreateContainer", nodeSLO=[1])), "nodeSLO", id="a list as the NodeSLO"),
    pytest.param(json.dumps(doc("PreCreateContainer", plugins="cpuset")), "plugins", id="a string as the plugin list"),
    pytest.param(json.dumps(["PreCreateContainer"]), "JSON object", id="a list as the document"),
    pytest.param('{"stage": NaN}', "NaN", id="a NaN constant"),
    pytest.param(" " * (5 * 1024 * 1024), "characters", id="five MiB of input is too large"),
]


@pytest.mark.parametrize(("text", "message"), BAD_INPUTS)
def test_bad_input_exits_2_with_one_line_on_stderr(
    text: str, message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert main(["-"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("runtime-proxy plan: ") and err.count("\n") == 1, err
    assert message in err
    assert "Traceback" not in err


def test_missing_and_undecodable_files_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "absent.json")]) == 2
    (tmp_path / "latin1.json").write_bytes(b'{"stage": "\xe9"}')
    assert main([str(tmp_path / "latin1.json")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("runtime-proxy plan: cannot read") == 2


def test_the_cli_prints_no_traceback_for_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"stage": ["x"]}))
    done = subprocess.run([sys.executable, "-m", "runtime_proxy.cli", "plan", str(bad)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr and "unknown stage" in done.stderr


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("plan-*.json")))
def test_examples_in_packaging_plan_cleanly(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-o", "json", str(EXAMPLES / example)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["conflicts"] == []


RESCTRL_NODE = {"cpuTopology": TOPO, "resctrl": {"cbmMask": "fff", "cacheIds": [0], "vendor": "amd"}}
RDT_ON = {"resourceQOSStrategy": {"beClass": {"resctrlQOS": {"enable": True}},
                                  "lsClass": {"resctrlQOS": {"enable": True}}}}


@pytest.mark.parametrize(
    ("document", "key", "expected"),
    [
        pytest.param(doc("Reconcile", node=RESCTRL_NODE, nodeSLO=RDT_ON, plugins=["rdt"], pod=None, container=None),
                     "writes", [{"level": "resctrl", "path": "LS", "file": "schemata",
                                 "value": "L3:0=fff;\nMB:0=2048;\n"},
                                {"level": "resctrl", "path": "BE", "file": "schemata",
                                 "value": "L3:0=f;\nMB:0=2048;\n"}],
                     id="Reconcile without a pod plans node-wide resctrl groups (AMD MB)"),
        pytest.param(doc("PostStartContainer", node=RESCTRL_NODE, nodeSLO=RDT_ON, plugins=["rdt"],
                         container={"name": "app", "id": "c1"}),
                     "moves", [{"level": "container", "path": "kubepods/burstable/podu1/c1", "group": "LS"}],
                     id="PostStartContainer moves the container's tasks"),
        pytest.param(doc("PostStartContainer", nodeSLO={"cpuBurstStrategy": {"policy": "auto",
                                                                             "cpuBurstPercent": 50}},
                         plugins=["cpu_burst"], container={"name": "app", "id": "c1", "resources": {
                             "cpu_quota": 200000, "cpu_period": 100000}}),
                     "writes", [{"level": "container", "path": "kubepods/burstable/podu1/c1",
                                 "file": "cpu.cfs_burst_us", "value": "100000"}],
                     id="PostStartContainer sets cfs_burst_us"),
        pytest.param(doc("PostStartContainer", plugins=["cpuset"]), "cri", {}, id="post stages never change CRI"),
    ],
)
def test_plan_document_issue5(document: dict[str, Any], key: str, expected: Any) -> None:
    assert plan_document(document)[key] == expected


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param(doc("PreCreateContainer", nodeSlo={}), "nodeSlo: unknown key; did you mean nodeSLO?",
                     id="a misspelled top-level key is named with the key meant"),
        pytest.param(doc("PreCreateContainer", pod={"lables": {}}), "pod.lables: unknown key; did you mean labels?",
                     id="a misspelled pod key is named with its path"),
        pytest.param(doc("PreCreateContainer", node={"resctrl": {"cbm": "ff"}}), "node.resctrl.cbm: unknown key",
                     id="an unknown key deep in the node is named with its path"),
        pytest.param(doc("PreCreateContainer", node={"lsePods": ["a", 1]}), "node.lsePods.1: must be a string",
                     id="a wrongly typed list element is named with its index"),
    ],
)
def test_unknown_and_mistyped_keys_are_errors_with_their_path(document: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanInputError) as err:
        plan_document(document)
    assert message in str(err.value)


def test_null_values_mean_absent_as_before() -> None:
    out = plan_document(doc("PreCreateContainer", nodeSLO=None, node={"cpuTopology": TOPO, "labels": None}))
    assert out["cri"]["resources"] == {"cpuset_cpus": "0-7"}


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_plan_with_config_uses_its_order_policies_and_enabled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write(tmp_path / "c.yaml", "plugins:\n  - name: numa\n  - name: cpuset\n    policy: Fail\n"
                    "    timeout: 0.5\n  - name: rdt\n    enabled: false\ndefaultTimeout: 1.5\n")
    document = _write(tmp_path / "d.json", json.dumps(doc("PreCreateContainer")))
    assert main(["-o", "json", "--config", config, "--no-entry-points", document]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plugins"] == ["numa", "cpuset"]
    assert out["settings"] == [{"plugin": "numa", "policy": "Ignore", "timeout": 1.5},
                               {"plugin": "cpuset", "policy": "Fail", "timeout": 0.5}]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        pytest.param("plugins:\n  - name: nope\n", "'nope' is configured but not installed",
                     id="a configured plugin that is not installed"),
        pytest.param("plugin: []\n", "plugin: unknown key; did you mean plugins?", id="a misspelled config key"),
        pytest.param("pluginModules: [no_such_module_here]\n", "pluginModules entry 'no_such_module_here'",
                     id="a plugin module that does not import"),
    ],
)
def test_plan_with_a_bad_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, message: str
) -> None:
    document = _write(tmp_path / "d.json", json.dumps(doc("PreCreateContainer")))
    assert main(["--config", _write(tmp_path / "c.yaml", config), document]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err


def test_several_files_give_one_result_each_in_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path / "good.json", json.dumps(doc("PreCreateContainer")))
    bad = _write(tmp_path / "bad.json", json.dumps(doc("PreCreateContainer", nodeSlo={})))
    assert main(["-o", "json", "--compact", good, bad, good]) == 2
    out, err = capsys.readouterr()
    results = json.loads(out)
    assert [r["file"] for r in results] == [good, bad, good]
    assert results[0]["plan"] == results[2]["plan"] and results[0]["plan"]["cri"]["resources"]
    assert "nodeSlo: unknown key" in results[1]["error"]
    assert err.count("\n") == 1 and err.startswith(f"runtime-proxy plan: {bad}: ")
    assert out.count("\n") == 1


def test_entry_point_plugins_and_plugin_modules_are_planned(tmp_path: Path) -> None:
    """A plugin installed under the entry-point group (a dist-info directory on the path) runs
    in ``plan`` as in the proxy; ``--no-entry-points`` leaves it out; ``pluginModules`` adds one."""
    plugin = ("from hooks import Plan, hookimpl\n\n@hookimpl\ndef rhp_pre_create_container(pod):\n"
              "    return Plan().set_env('FROM', '{name}')\n")
    (tmp_path / "ep_plugin.py").write_text(plugin.format(name="ep_plugin"))
    (tmp_path / "mod_plugin.py").write_text(plugin.format(name="mod_plugin").replace("FROM", "FROM_MODULE"))
    dist = tmp_path / "ep_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[runtime_hook_proxy.plugins]\nep_plugin = ep_plugin\n")
    document = _write(tmp_path / "d.json", json.dumps(doc("PreCreateContainer")))
    config = _write(tmp_path / "c.yaml", "pluginModules: [mod_plugin]\n")
    env = {"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[3]}", "PATH": "/usr/bin:/bin"}

    def plan(*argv: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "runtime_proxy.cli", "plan", "-o", "json", *argv],
                              capture_output=True,
                              text=True, timeout=60, check=False, env=env)
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    out = plan(document, "--config", config)
    assert out["plugins"][-2:] == ["ep_plugin", "mod_plugin"]
    assert out["cri"]["envs"] == {"FROM": "ep_plugin", "FROM_MODULE": "mod_plugin"}
    assert "ep_plugin" not in plan(document, "--no-entry-points")["plugins"]


def test_a_flood_of_bad_keys_gives_one_short_line(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    flood = doc("PreCreateContainer", **{f"k{i}" + "x" * 5000: 1 for i in range(500)})
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(flood)))
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and len(err) < 2000
    assert "unknown key" in err and "and 495 more" in err
