"""``scheduler-ext remove-leases`` (the chart's post-delete hook) against the fake API server: it
waits for the release's pods to go, deletes exactly the named and prefixed Leases of its
namespace (others' stay, kube-system's own included), and a Lease already gone is no error."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from scheduler_ext.cli import main
from tests.fakeapi import FakeAPIServer

NS = "kube-system"


def _lease(name: str, namespace: str = NS) -> dict[str, object]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name, "namespace": namespace},
            "spec": {"holderIdentity": "x"}}


def _kubeconfig(api: FakeAPIServer, path: Path) -> Path:
    path.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\n"
                    f"clusters: [{{name: f, cluster: {{server: '{api.url}'}}}}]\n"
                    "users: [{name: u, user: {token: t}}]\n"
                    "contexts: [{name: c, context: {cluster: f, user: u}}]\n")
    return path


def test_the_release_leases_go_once_its_pods_are_gone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeAPIServer() as api:
        for name in ("rhp-scheduler", "rhp-manager", "scheduler-ext-node-a", "scheduler-ext-node-b",
                     "kube-scheduler", "kube-controller-manager"):
            api.create(_lease(name))
        api.create(_lease("rhp-manager", "elsewhere"))
        api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "manager-0", "namespace": NS, "labels": {"app.kubernetes.io/instance": "rhp"}}})
        threading.Timer(1.5, lambda: api.delete("Pod", "manager-0", NS)).start()
        started = time.monotonic()
        code = main(["remove-leases", "--kubeconfig", str(_kubeconfig(api, tmp_path / "k")), "--namespace", NS,
                     "--name", "rhp-scheduler", "--name", "rhp-manager", "--name", "gone-already",
                     "--prefix", "scheduler-ext-", "--wait-pods", "app.kubernetes.io/instance=rhp"])
        assert code == 0 and time.monotonic() - started >= 1.0, "it waited for the pod"
        out = json.loads(capsys.readouterr().out)
        assert out == {"namespace": NS, "deleted": ["rhp-manager", "rhp-scheduler", "scheduler-ext-node-a",
                                                    "scheduler-ext-node-b"]}
        left = sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in api.objects("Lease"))
        assert left == [("elsewhere", "rhp-manager"), (NS, "kube-controller-manager"), (NS, "kube-scheduler")]


def test_pods_that_stay_fail_it_after_the_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeAPIServer() as api:
        api.create(_lease("rhp-manager"))
        api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "stuck", "namespace": NS, "labels": {"app.kubernetes.io/instance": "rhp"}}})
        code = main(["remove-leases", "--kubeconfig", str(_kubeconfig(api, tmp_path / "k")), "--namespace", NS,
                     "--name", "rhp-manager", "--wait-pods", "app.kubernetes.io/instance=rhp", "--timeout", "1"])
        assert code == 1 and "still exist" in capsys.readouterr().err
        assert api.get("Lease", "rhp-manager", NS) is not None


def test_nothing_to_match_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["remove-leases", "--namespace", NS, "--kubeconfig", str(tmp_path / "none")]) == 2
    assert "--name or --prefix" in capsys.readouterr().err


def test_the_leases_go_through_the_one_transport(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``remove-leases`` lists pods and Leases (paged) and deletes through ``rhp_kube.http`` on the
    fake API server; a refused call is one line with the API's status and message, and exit 1.
    The generated client's CoreV1Api and CoordinationV1Api are made unusable: the old main's
    command went through them."""
    import kubernetes

    from scheduler_ext import cleanup

    def no_generated_client(*args: object, **kwargs: object) -> None:
        raise AssertionError("a call went through the generated client")

    monkeypatch.setattr(kubernetes.client, "CoreV1Api", no_generated_client)
    monkeypatch.setattr(kubernetes.client, "CoordinationV1Api", no_generated_client)
    monkeypatch.setattr(cleanup, "LIST_PAGE", 2)
    with FakeAPIServer() as api:
        for name in ("rhp-a", "rhp-b", "rhp-c", "other"):
            api.create(_lease(name))
        kubeconfig = str(_kubeconfig(api, tmp_path / "k"))
        code = main(["remove-leases", "--kubeconfig", kubeconfig, "--namespace", NS, "--prefix", "rhp-",
                     "--wait-pods", "app=gone"])
        assert code == 0
        assert json.loads(capsys.readouterr().out) == {"namespace": NS, "deleted": ["rhp-a", "rhp-b", "rhp-c"]}
        assert [o["metadata"]["name"] for o in api.objects("Lease")] == ["other"]
        api.inject("DELETE", r"/leases/other$", 403)
        assert main(["remove-leases", "--kubeconfig", kubeconfig, "--namespace", NS, "--name", "other"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("scheduler-ext remove-leases: the API server refused: 403") and err.count("\n") == 1
        assert api.get("Lease", "other", NS) is not None
