"""``scheduler-ext simulate`` judges placed pods' allocation annotations as the live extender
does (issue 37 item 6): a forged cpuset on a pod created with ``spec.nodeName`` counts for
nothing, a signature verifies only with ``--public-key-file``'s keys, and ``--trust-all`` counts
everything for what-if documents. On the old main simulate counted every annotation, so the
forged pod fenced off the node (``test_a_forged_allocation_counts_for_nothing_by_default``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from koord_formats import keys
from koord_formats.signature import format_public_key
from scheduler_ext.cli import main, simulate
from scheduler_ext.trust import TRUST_ALL, Signer, Trust
from tests.scheduler_ext.builders import cluster, pod

RS = keys.ANNOTATION_RESOURCE_STATUS
SIG = keys.ANNOTATION_ALLOCATION_SIGNATURE


def _doc(placed: dict[str, Any]) -> dict[str, Any]:
    return {"objects": [*cluster(["a"]), placed], "pod": pod("new", cpu="16")}


def _forged() -> dict[str, Any]:
    return pod("tenant", cpu="16", node_name="a", scheduler_name="default-scheduler",
               annotations={RS: json.dumps({"cpuset": "0-15"})})  # fmt: skip


def _run(tmp_path: Path, doc: dict[str, Any], *flags: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["simulate", *flags, str(path)]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_a_forged_allocation_counts_for_nothing_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(tmp_path, _doc(_forged()), capsys=capsys)
    assert out["selected"] == "a", out
    assert _run(tmp_path, _doc(_forged()), "--trust-all", capsys=capsys)["selected"] is None
    assert _run(tmp_path, _doc(_forged()), "--trusted-scheduler-names=default-scheduler",
                capsys=capsys)["selected"] is None  # fmt: skip
    assert simulate(_doc(_forged()))["selected"] == "a"
    assert simulate(_doc(_forged()), trust=TRUST_ALL)["selected"] is None


def test_a_signed_allocation_counts_with_the_public_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    signer = Signer.generate()
    placed = pod("signed", cpu="16", node_name="a", scheduler_name="runtime-hook-proxy-scheduler", uid="uid-s",
                 annotations={RS: json.dumps({"cpuset": "0-15"})})  # fmt: skip
    ann = placed["metadata"]["annotations"]
    ann[SIG] = Trust.of(signer, []).sign("uid-s", "default", "signed", "a", 16000, ann)
    public = tmp_path / "public-keys"
    public.write_text(format_public_key(signer.public_raw) + "\n")
    assert _run(tmp_path, _doc(placed), f"--public-key-file={public}", capsys=capsys)["selected"] is None
    # without the key the signature cannot be checked: counted, as the live extender does, since
    # its CPUs are within the pod's request
    assert _run(tmp_path, _doc(placed), capsys=capsys)["selected"] is None
    ann[RS] = json.dumps({"cpuset": "0-15"}) + " "  # changed after signing: refuted by the key
    assert _run(tmp_path, _doc(placed), f"--public-key-file={public}", capsys=capsys)["selected"] == "a"


def test_a_bad_public_key_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad"
    bad.write_text("ed25519 not-base64\n")
    path = tmp_path / "doc.yaml"
    path.write_text(yaml.safe_dump(_doc(_forged())))
    assert main(["simulate", f"--public-key-file={bad}", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--public-key-file" in err and len(err.strip().splitlines()) == 1
