"""``scheduler-ext simulate`` on bad input: a clear message on stderr and a documented exit
code, never a traceback; stdout carries only the result document."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from scheduler_ext import cli
from tests.scheduler_ext.builders import cluster, node, pod

ROOT = Path(__file__).resolve().parents[2]
RS = "scheduling.koordinator.sh/resource-status"
DA = "scheduling.koordinator.sh/device-allocated"


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``main`` configures structlog for the process; give the next test the defaults back."""
    yield
    structlog.reset_defaults()


def good_doc(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"objects": cluster(["a"]), "pod": pod("new", cpu="2")}
    doc.update(extra)
    return doc


def run_main(tmp_path: Path, text: str | bytes, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    path = tmp_path / "doc"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    code = cli.main(["simulate", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        pytest.param("[]", 3, "must be an object", id="a document that is a list"),
        pytest.param("5", 3, "must be an object", id="a document that is a number"),
        pytest.param("", 3, "must be an object", id="an empty document"),
        pytest.param('{"objects": []}', 3, '"pod"', id="a document without a pod"),
        pytest.param('{"objects": 5, "pod": {}}', 3, '"objects" (a list)', id="objects that is a number"),
        pytest.param('{"objects": [], "pod": []}', 3, '"pod" (an object)', id="a pod that is a list"),
        pytest.param(": not yaml :", 3, "neither JSON nor YAML", id="a YAML syntax error"),
        pytest.param("a: [1, 2\nb: {", 3, "neither JSON nor YAML", id="an unclosed YAML flow"),
        pytest.param("\tobjects: []", 3, "neither JSON nor YAML", id="a YAML tab indent"),
        pytest.param("[" * 100000, 3, "nested too deeply", id="JSON nested 100000 deep"),
        pytest.param(b"\xff\xfe objects", 2, "not UTF-8", id="bytes that are not UTF-8"),
    ],
)
def test_bad_documents_get_a_message_and_an_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | bytes, code: int, message: str
) -> None:
    got, out, err = run_main(tmp_path, text, capsys)
    assert got == code
    assert out == ""
    assert message in err and "Traceback" not in err
    assert err.startswith("scheduler-ext simulate: ")


def test_a_missing_file_is_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", str(tmp_path / "nope.yaml")]) == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and "No such file" in err and "Traceback" not in err


def test_a_directory_is_exit_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", str(tmp_path)]) == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err


def wrongly_typed() -> list[Any]:
    labels_list = node("b")
    labels_list["metadata"]["labels"] = ["x"]
    spec_string = pod("p2", node_name="a")
    spec_string["spec"] = "x"
    return [
        pytest.param(5, id="an object that is a number"),
        pytest.param("Node", id="an object that is a string"),
        pytest.param(None, id="an object that is null"),
        pytest.param({"kind": ["Node"]}, id="a kind that is a list"),
        pytest.param({"kind": "Node", "metadata": 5}, id="metadata that is a number"),
        pytest.param({"kind": "Node", "metadata": {"name": 5}}, id="a name that is a number"),
        pytest.param(labels_list, id="labels that are a list"),
        pytest.param({"kind": "NodeResourceTopology", "metadata": {"name": "b"}, "topologyPolicies": 5},
                     id="topologyPolicies that is a number"),
        pytest.param({"kind": "Device", "metadata": {"name": "a"}, "spec": [1]}, id="a Device spec that is a list"),
        pytest.param(spec_string, id="a pod spec that is a string"),
        pytest.param(pod("p3", node_name="a", annotations={DA: '{"gpu":[5]}'}), id="device-allocated [5]"),
        pytest.param(pod("p4", node_name="a", annotations={RS: "[" * 3000}), id="resource-status nested 3000 deep"),
        pytest.param(pod("p5", node_name="a", annotations={RS: '{"cpuset":5}'}), id="a numeric cpuset"),
    ]


@pytest.mark.parametrize("bad", wrongly_typed())
def test_wrongly_typed_objects_are_skipped_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: Any
) -> None:
    doc = good_doc()
    doc["objects"].append(bad)
    code, out, err = run_main(tmp_path, json.dumps(doc), capsys)
    assert code == 0 and "Traceback" not in err
    result = json.loads(out)  # stdout holds exactly one JSON document
    assert result["selected"] == "a"
    if isinstance(bad, dict) and bad.get("kind") == "Pod" and isinstance(bad.get("spec"), dict):
        return  # a readable pod with unreadable annotations is kept: it holds nothing
    assert result["skipped"] and all(f"skipped {s}" in err for s in result["skipped"])


@pytest.mark.parametrize(
    "bad_pod",
    [
        pytest.param({"metadata": 5}, id="metadata that is a number"),
        pytest.param({"spec": {"containers": [{"resources": {"requests": {"memory": "1e500000"}}}]}},
                     id="memory of 1e500000 bytes"),
        pytest.param({"spec": {"containers": 5}}, id="containers that is a number"),
        pytest.param({"metadata": {"annotations": {"scheduling.koordinator.sh/resource-spec": "[" * 3000}}},
                     id="a resource-spec nested 3000 deep"),
    ],
)
def test_an_undecodable_pod_is_infeasible_everywhere_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad_pod: dict[str, Any]
) -> None:
    code, out, err = run_main(tmp_path, json.dumps(good_doc(pod=bad_pod)), capsys)
    assert code == 0 and "Traceback" not in err
    result = json.loads(out)
    assert result["selected"] is None
    assert all(not n["feasible"] and "invalid pod request" in n["reason"] for n in result["nodes"])


def test_in_a_real_process_logs_go_to_stderr_and_stdout_is_pure_json(tmp_path: Path) -> None:
    doc = good_doc()
    doc["objects"].append(pod("poisoned", node_name="a", annotations={DA: '{"gpu":[5]}'}))
    doc["objects"].append(5)
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = subprocess.run([sys.executable, "-m", "scheduler_ext.cli", "simulate", str(path), "--pretty"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    result = json.loads(done.stdout)
    assert result["selected"] == "a" and result["skipped"] == ["objects[3] (a int, not an object)"]
    assert "skipped unreadable object" in done.stderr  # the structlog warning, on stderr
    assert "Traceback" not in done.stderr


def test_help_documents_the_exit_codes() -> None:
    done = subprocess.run([sys.executable, "-m", "scheduler_ext.cli", "simulate", "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for line in ("0  the placement was computed", "1  an unexpected internal error",
                 "2  bad flags, or the input cannot be read", "3  the document is not JSON or YAML"):
        assert line in done.stdout
