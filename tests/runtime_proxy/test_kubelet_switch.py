"""``runtime-proxy kubelet-switch`` (``runtime_proxy.kubelet``) on prepared kubelet files: the
endpoint edit keeps everything else, the switch happens only when doctor passes and /readyz is
200, a backup is kept, a failed restart restores the files, and ``--to containerd`` rolls back.
No kubelet runs: the restart command is a test command."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime_proxy import metrics
from runtime_proxy.cli import main
from runtime_proxy.kubelet import PROXY_ENDPOINT, SwitchError, set_config_endpoint, set_flag_endpoint

CONTAINERD = "unix:///run/containerd/containerd.sock"
CONFIG = f"""\
# kubelet config written by kubeadm
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
containerRuntimeEndpoint: {CONTAINERD}   # the runtime
evictionHard:
  memory.available: 100Mi
"""
FLAGS = f'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint={CONTAINERD} --pod-infra-container-image=pause:3.9"\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(CONFIG, CONFIG.replace(f"{CONTAINERD}   # the runtime", PROXY_ENDPOINT),
                     id="the existing key is replaced and every other line kept"),
        pytest.param("kind: KubeletConfiguration\ncgroupDriver: systemd",
                     f"kind: KubeletConfiguration\ncgroupDriver: systemd\ncontainerRuntimeEndpoint: {PROXY_ENDPOINT}\n",
                     id="a missing key is added at the end"),
        pytest.param("", f"containerRuntimeEndpoint: {PROXY_ENDPOINT}\n", id="an empty file gets the key"),
    ],
)
def test_config_endpoint_edit(text: str, expected: str) -> None:
    assert set_config_endpoint(text, PROXY_ENDPOINT) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("- a\n- b\n", "not a KubeletConfiguration mapping", id="a list is refused"),
        pytest.param("kind: Pod\n", "not KubeletConfiguration", id="another kind is refused"),
        pytest.param("a: [\n", "not YAML", id="broken YAML is refused"),
    ],
)
def test_config_endpoint_refuses_other_files(text: str, message: str) -> None:
    with pytest.raises(SwitchError, match=message):
        set_config_endpoint(text, PROXY_ENDPOINT)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(FLAGS, FLAGS.replace(CONTAINERD, PROXY_ENDPOINT), id="kubeadm-flags.env with ="),
        pytest.param(f"ExecStart=/usr/bin/kubelet --container-runtime-endpoint {CONTAINERD} --v=2\n",
                     f"ExecStart=/usr/bin/kubelet --container-runtime-endpoint {PROXY_ENDPOINT} --v=2\n",
                     id="a drop-in with a space"),
        pytest.param(f"ARGS=--container-runtime-endpoint='{CONTAINERD}'\n",
                     f"ARGS=--container-runtime-endpoint={PROXY_ENDPOINT}\n", id="a quoted value"),
    ],
)
def test_flag_endpoint_edit(text: str, expected: str) -> None:
    assert set_flag_endpoint(text, PROXY_ENDPOINT) == expected


def test_flag_file_without_the_flag_is_refused() -> None:
    with pytest.raises(SwitchError, match="no --container-runtime-endpoint"):
        set_flag_endpoint("KUBELET_EXTRA_ARGS=--v=2\n", PROXY_ENDPOINT)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A cgroup v1 tree with what the cpuset plugin needs, and kubelet's two files."""
    for controller, files in {"cpuset": ["cpuset.cpus", "cpuset.mems"],
                              "cpu": ["cpu.cfs_quota_us", "cpu.shares", "cpu.idle"]}.items():
        (tmp_path / "cg" / controller).mkdir(parents=True)
        for f in files:
            (tmp_path / "cg" / controller / f).write_text("0\n")
    (tmp_path / "config.yaml").write_text(CONFIG)
    (tmp_path / "kubeadm-flags.env").write_text(FLAGS)
    return tmp_path


@pytest.fixture
def readyz() -> Iterator[dict[str, object]]:
    state: dict[str, object] = {"ready": True}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = metrics.serve(f"127.0.0.1:{port}", lambda: (bool(state["ready"]), "store not rebuilt"))
    state["url"] = f"http://127.0.0.1:{port}/readyz"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def _switch(node: Path, readyz: dict[str, object], *extra: str, plugins: str = "cpuset",
            restart: str = "") -> int:
    restart = restart or f"touch {node / 'restarted'}"
    return main(["kubelet-switch", "--kubelet-config", str(node / "config.yaml"),
                 "--flags-file", str(node / "kubeadm-flags.env"), "--readyz", str(readyz["url"]),
                 "--restart-command", restart, "--cgroup-root", str(node / "cg"),
                 "--resctrl-root", str(node / "resctrl"), "--plugins", plugins,
                 "--skip", "runtime", "--skip", "nri", "--skip", "listen", "--skip", "hook-servers", *extra])


def _unchanged(node: Path) -> bool:
    return ((node / "config.yaml").read_text() == CONFIG and (node / "kubeadm-flags.env").read_text() == FLAGS
            and not (node / "restarted").exists())


def test_switch_then_roll_back(node: Path, readyz: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    assert _switch(node, readyz, "--to", "proxy") == 0
    assert f"containerRuntimeEndpoint: {PROXY_ENDPOINT}\n" in (node / "config.yaml").read_text()
    assert (node / "config.yaml").read_text().startswith("# kubelet config written by kubeadm\n")
    assert f"--container-runtime-endpoint={PROXY_ENDPOINT} " in (node / "kubeadm-flags.env").read_text()
    assert (node / "config.yaml.rhp-backup").read_text() == CONFIG
    assert (node / "restarted").exists()
    out = capsys.readouterr().out
    assert "doctor passed" in out and "ready" in out
    (node / "restarted").unlink()
    assert _switch(node, readyz, "--to", "proxy") == 0  # again: the backup still holds containerd's
    assert (node / "config.yaml.rhp-backup").read_text() == CONFIG
    (node / "restarted").unlink()
    assert _switch(node, readyz, "--to", "containerd") == 0
    assert (node / "config.yaml").read_text() == CONFIG and (node / "kubeadm-flags.env").read_text() == FLAGS
    assert not (node / "config.yaml.rhp-backup").exists() and (node / "restarted").exists()


def test_no_switch_when_doctor_fails(node: Path, readyz: dict[str, object],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert _switch(node, readyz, "--to", "proxy", plugins="cpuset,rdt") == 1
    assert _unchanged(node)
    assert "doctor: resctrl: not mounted" in capsys.readouterr().out


def test_no_switch_while_the_proxy_is_not_ready(node: Path, readyz: dict[str, object],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    readyz["ready"] = False
    assert _switch(node, readyz, "--to", "proxy") == 1
    assert _unchanged(node)
    assert "is not ready (503: store not rebuilt)" in capsys.readouterr().out


def test_a_failed_restart_restores_the_files(node: Path, readyz: dict[str, object]) -> None:
    assert _switch(node, readyz, "--to", "proxy", restart="false") == 1
    assert (node / "config.yaml").read_text() == CONFIG and (node / "kubeadm-flags.env").read_text() == FLAGS


def test_dry_run_changes_nothing(node: Path, readyz: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    assert _switch(node, readyz, "--to", "proxy", "--dry-run") == 0
    assert _unchanged(node) and not (node / "config.yaml.rhp-backup").exists()
    assert "would change the endpoint" in capsys.readouterr().out


def test_unusable_files_exit_2_before_any_check(node: Path, readyz: dict[str, object],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (node / "kubeadm-flags.env").write_text("KUBELET_EXTRA_ARGS=--v=2\n")
    assert _switch(node, readyz, "--to", "proxy") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no --container-runtime-endpoint" in err
    assert main(["kubelet-switch", "--to", "proxy"]) == 2
