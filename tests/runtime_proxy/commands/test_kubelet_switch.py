"""``runtime-proxy kubelet-switch`` (``runtime_proxy.commands.kubelet_switch``) on prepared kubelet files: the
endpoint edit (YAML in place, JSON re-serialised) changes that value only and is verified by
parsing, what cannot be edited exactly is exit 2 with nothing changed, the switch happens only
when doctor passes and /readyz is 200, a backup is kept, a failed restart or a failed second
file restores the files, a symlink is edited at its target, and ``--to containerd`` sets only
the endpoint back.
No kubelet runs: the restart command is a test command."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from runtime_proxy import metrics
from runtime_proxy.cli import main
from runtime_proxy.commands import kubelet_switch as kubelet
from runtime_proxy.commands.kubelet_switch import PROXY_ENDPOINT, SwitchError, set_config_endpoint, set_flag_endpoint

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
        pytest.param(CONFIG, CONFIG.replace(f"{CONTAINERD}   # the runtime", f"{PROXY_ENDPOINT}   # the runtime"),
                     id="the existing value is replaced and every other line and comment kept"),
        pytest.param(f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint:\n  {CONTAINERD}\nmaxPods: 110\n",
                     f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint:\n  {PROXY_ENDPOINT}\nmaxPods: 110\n",
                     id="a value on the next line is replaced where it is, not joined to the new one"),
        pytest.param(f'kind: KubeletConfiguration\ncontainerRuntimeEndpoint: "{CONTAINERD}" # quoted\n',
                     f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint: {PROXY_ENDPOINT} # quoted\n",
                     id="a quoted value is replaced whole"),
        pytest.param("kind: KubeletConfiguration\ncontainerRuntimeEndpoint:\nmaxPods: 5\n",
                     f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint: {PROXY_ENDPOINT}\nmaxPods: 5\n",
                     id="an empty value is filled"),
        pytest.param("kind: KubeletConfiguration\nevictionHard:\n  memory.available: 100Mi\n# end\n",
                     f"kind: KubeletConfiguration\nevictionHard:\n  memory.available: 100Mi\n# end\n"
                     f"containerRuntimeEndpoint: {PROXY_ENDPOINT}\n",
                     id="a missing key is added after the last one, at the top level"),
        pytest.param('{"kind": "KubeletConfiguration", "maxPods": 110}',
                     f'{{\n  "kind": "KubeletConfiguration",\n  "maxPods": 110,\n'
                     f'  "containerRuntimeEndpoint": "{PROXY_ENDPOINT}"\n}}\n',
                     id="a JSON file stays JSON, with the key added"),
        pytest.param(f'{{"containerRuntimeEndpoint": "{CONTAINERD}", "kind": "KubeletConfiguration"}}',
                     f'{{\n  "containerRuntimeEndpoint": "{PROXY_ENDPOINT}",\n  "kind": "KubeletConfiguration"\n}}\n',
                     id="a JSON value is replaced in its place"),
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
        pytest.param('{"kind": "KubeletConfiguration",', "not JSON", id="broken JSON is refused"),
        pytest.param(f"containerRuntimeEndpoint: a\ncontainerRuntimeEndpoint: {CONTAINERD}\n", "appears twice",
                     id="the key twice is refused"),
        pytest.param('{"containerRuntimeEndpoint": "a", "containerRuntimeEndpoint": "b"}', "appears twice",
                     id="the key twice in JSON is refused"),
        pytest.param(f"x: &ep {CONTAINERD}\ncontainerRuntimeEndpoint: *ep\n", "anchors are not allowed",
                     id="an alias shared with another key is refused"),
        pytest.param("{kind: KubeletConfiguration}\n", "not JSON", id="a YAML flow mapping is refused"),
        pytest.param("containerRuntimeEndpoint: {a: 1}\n", "not a string", id="a value that is not a string"),
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


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``main`` configures structlog for the process; give the next test the defaults back."""
    yield
    structlog.reset_defaults()


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
    assert f"containerRuntimeEndpoint: {PROXY_ENDPOINT}   # the runtime\n" in (node / "config.yaml").read_text()
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
    """cpu_burst needs cpu.cfs_burst_us, which this node's tree lacks."""
    assert _switch(node, readyz, "--to", "proxy", plugins="cpuset,cpu_burst") == 1
    assert _unchanged(node)
    assert "doctor: cfs burst (cpu.cfs_burst_us): no cpu.cfs_burst_us" in capsys.readouterr().out


def test_rdt_without_resctrl_does_not_stop_the_switch(node: Path, readyz: dict[str, object]) -> None:
    """The proxy skips rdt where resctrl is absent, so doctor only warns and the switch goes on."""
    assert _switch(node, readyz, "--to", "proxy", plugins="cpuset,rdt") == 0
    assert (node / "restarted").exists()


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


def test_the_key_is_removed_again_when_asked(tmp_path: Path) -> None:
    text = f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint: {CONTAINERD}  # x\nmaxPods: 5\n"
    assert set_config_endpoint(text, None) == "kind: KubeletConfiguration\nmaxPods: 5\n"


def _rollback(node: Path, *extra: str) -> int:
    return main(["kubelet-switch", "--to", "containerd", "--kubelet-config", str(node / "config.yaml"),
                 "--flags-file", str(node / "kubeadm-flags.env"), "--restart-command", f"touch {node / 'restarted'}",
                 *extra])


def test_rollback_changes_only_the_endpoint(node: Path, readyz: dict[str, object]) -> None:
    """Later kubelet edits survive a rollback: only the endpoint goes back to the backup's."""
    assert _switch(node, readyz, "--to", "proxy") == 0
    later = "cgroupDriver: systemd\nmaxPods: 250\n"
    (node / "config.yaml").write_text((node / "config.yaml").read_text().replace("cgroupDriver: systemd\n", later))
    flags = (node / "kubeadm-flags.env").read_text().replace("pause:3.9", "pause:3.10")
    (node / "kubeadm-flags.env").write_text(flags)
    assert _rollback(node) == 0
    assert (node / "config.yaml").read_text() == CONFIG.replace("cgroupDriver: systemd\n", later)
    assert (node / "kubeadm-flags.env").read_text() == FLAGS.replace("pause:3.9", "pause:3.10")
    assert not (node / "config.yaml.rhp-backup").exists() and not (node / "kubeadm-flags.env.rhp-backup").exists()


def test_rollback_removes_a_key_the_backup_did_not_have(node: Path, readyz: dict[str, object]) -> None:
    original = "kind: KubeletConfiguration\ncgroupDriver: systemd\n"
    (node / "config.yaml").write_text(original)
    assert _switch(node, readyz, "--to", "proxy") == 0
    assert _rollback(node) == 0
    assert (node / "config.yaml").read_text() == original


def test_rollback_without_backup_keeps_json_json(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"kind": "KubeletConfiguration", "containerRuntimeEndpoint": PROXY_ENDPOINT}
    (node / "config.yaml").write_text(json.dumps(doc))
    assert _rollback(node) == 0
    assert json.loads((node / "config.yaml").read_text()) == {"kind": "KubeletConfiguration",
                                                               "containerRuntimeEndpoint": CONTAINERD}
    assert "no backup found" in capsys.readouterr().out


def test_a_switch_failing_on_its_second_file_restores_the_first(node: Path, readyz: dict[str, object],
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    real = kubelet._write_atomically

    def fail_on_flags(path: Path, text: str) -> None:
        if path.name == "kubeadm-flags.env":
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(kubelet, "_write_atomically", fail_on_flags)
    assert _switch(node, readyz, "--to", "proxy") == 2
    assert _unchanged(node)
    assert not (node / "config.yaml.rhp-backup").exists() and not (node / "kubeadm-flags.env.rhp-backup").exists()
    err = capsys.readouterr().err
    assert "No space left on device" in err and "restored" in err and err.count("\n") == 1


def test_a_symlinked_config_is_edited_at_its_target(node: Path, readyz: dict[str, object]) -> None:
    (node / "etc").mkdir()
    (node / "config.yaml").rename(node / "etc" / "kubelet.yaml")
    (node / "config.yaml").symlink_to(node / "etc" / "kubelet.yaml")
    assert _switch(node, readyz, "--to", "proxy") == 0
    assert (node / "config.yaml").is_symlink()
    assert f"containerRuntimeEndpoint: {PROXY_ENDPOINT}" in (node / "etc" / "kubelet.yaml").read_text()
    assert _rollback(node) == 0
    assert (node / "config.yaml").is_symlink() and (node / "etc" / "kubelet.yaml").read_text() == CONFIG


def test_a_config_that_cannot_be_edited_exactly_exits_2_and_changes_nothing(
        node: Path, readyz: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    broken = f"kind: KubeletConfiguration\ncontainerRuntimeEndpoint: a\ncontainerRuntimeEndpoint: {CONTAINERD}\n"
    (node / "config.yaml").write_text(broken)
    assert _switch(node, readyz, "--to", "proxy") == 2
    assert (node / "config.yaml").read_text() == broken and (node / "kubeadm-flags.env").read_text() == FLAGS
    assert not (node / "restarted").exists() and not (node / "config.yaml.rhp-backup").exists()
    assert "appears twice" in capsys.readouterr().err
    assert _rollback(node) == 2
    assert (node / "config.yaml").read_text() == broken and (node / "kubeadm-flags.env").read_text() == FLAGS


def test_the_written_file_is_read_back_and_checked(node: Path, readyz: dict[str, object],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A write that lands differently (here: something else rewrites the file) is caught by the
    re-parse after writing, and the files go back."""
    real = kubelet._write_atomically

    def lossy(path: Path, text: str) -> None:
        real(path, text.replace("cgroupDriver: systemd", "cgroupDriver: cgroupfs"))

    monkeypatch.setattr(kubelet, "_write_atomically", lossy)
    assert _switch(node, readyz, "--to", "proxy") == 2
    assert "read back after writing" in capsys.readouterr().err
    monkeypatch.setattr(kubelet, "_write_atomically", real)
    assert (node / "config.yaml").read_text().replace("cgroupfs", "systemd") == CONFIG


# -- the package's prerm guard: --to containerd --if-on-proxy (issue 32, item 5) -------------------


def _guard(node: Path, restart: str = "", *files: str) -> int:
    argv = ["kubelet-switch", "--to", "containerd", "--if-on-proxy",
            "--restart-command", restart or f"touch {node / 'restarted'}"]
    for f in files or ("config.yaml", "kubeadm-flags.env"):
        argv += ["--flags-file" if f.endswith(".env") else "--kubelet-config", str(node / f)]
    return main(argv)


def test_the_guard_does_nothing_while_kubelet_is_on_containerd(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _guard(node, "", "config.yaml", "kubeadm-flags.env", "missing.yaml") == 0
    assert _unchanged(node)
    out = capsys.readouterr().out
    assert "missing.yaml: not there" in out and "nothing to switch back" in out


def test_the_guard_switches_back_the_files_naming_the_proxy(node: Path, readyz: dict[str, object]) -> None:
    assert _switch(node, readyz, "--to", "proxy") == 0
    (node / "restarted").unlink()
    assert _guard(node) == 0
    assert (node / "config.yaml").read_text() == CONFIG and (node / "kubeadm-flags.env").read_text() == FLAGS
    assert (node / "restarted").exists()
    assert not (node / "config.yaml.rhp-backup").exists()


def test_the_guard_switches_back_a_proxy_endpoint_written_by_hand(node: Path) -> None:
    (node / "config.yaml").write_text(CONFIG.replace(CONTAINERD, "unix:///run/koord-runtimeproxy/runtimeproxy.sock"))
    assert _guard(node, "", "config.yaml") == 0  # /run is /var/run; no backup: containerd's socket
    assert f"containerRuntimeEndpoint: {CONTAINERD}" in (node / "config.yaml").read_text()
    assert (node / "restarted").exists()


def test_a_failed_restart_leaves_kubelet_s_files_on_the_proxy(node: Path, readyz: dict[str, object],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """kubelet was not restarted, so it still runs on the proxy: the files must say so, and the
    caller (the package's prerm) keeps the proxy running."""
    assert _switch(node, readyz, "--to", "proxy") == 0
    on_proxy = (node / "config.yaml").read_text(), (node / "kubeadm-flags.env").read_text()
    assert _guard(node, "false") == 1
    assert ((node / "config.yaml").read_text(), (node / "kubeadm-flags.env").read_text()) == on_proxy
    assert (node / "config.yaml.rhp-backup").read_text() == CONFIG  # a later rollback still finds it
    assert "restored (kubelet was not restarted" in capsys.readouterr().out
    assert _guard(node) == 0
    assert (node / "config.yaml").read_text() == CONFIG


def test_the_guard_goes_only_with_to_containerd(node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["kubelet-switch", "--to", "proxy", "--if-on-proxy", "--kubelet-config", str(node / "config.yaml")]
    assert main(argv) == 2
    assert "--if-on-proxy goes with --to containerd" in capsys.readouterr().err
