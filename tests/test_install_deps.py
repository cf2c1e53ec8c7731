"""What ``scripts/demo.sh`` and ``scripts/test.sh`` install (issue 34, item 8): the demo's set-up,
``scripts/install-deps.sh --demo``, installs the Debian packages of containerd 1.6 and the
package with its harness, and builds none of critest, Kubernetes, helm or the v2 node and fetches
no other containerd; without ``--demo`` (scripts/test.sh) every build runs.

The scripts run for real, copied into a scratch checkout whose build scripts, ``.venv/bin/python``
and ``apt-get``/``dpkg-query``/``id`` are stand-ins that write down how they were called (so it
needs neither root nor a package index, and installs nothing). On the old main ``demo.sh`` ran
every build script: the demo took 8 minutes on a fresh machine where it had taken 54 s. A build
script's stdout may carry a tool's line before the path it prints last (mke2fs -d does): the
set-up reads the last line (on the old main it read both, and failed on the v2 node's).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILDS = ("build-critest.sh", "build-kube.sh", "build-helm.sh", "build-v2node.sh")


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/usr/bin/env bash\necho \"{path.name} $*\" >>\"$RHP_CALLS\"\n{body}\n")
    path.chmod(0o755)


def _checkout(tmp: Path) -> tuple[Path, dict[str, str]]:
    """A scratch checkout with the real install-deps.sh and demo.sh and stand-ins for the rest."""
    root = tmp / "repo"
    (root / "scripts").mkdir(parents=True)
    (root / "devenv").mkdir()
    for name in ("scripts/install-deps.sh", "scripts/demo.sh", "pyproject.toml", "devenv/pyproject.toml"):
        shutil.copy(REPO / name, root / name)
    fake = tmp / "fake"
    # Each build prints what the real one prints on stdout (a path), which install-deps.sh reads.
    _stub(root / "scripts/build-critest.sh", f"echo {fake}/critest")
    _stub(root / "scripts/build-kube.sh", f"echo {fake}/kube")
    _stub(root / "scripts/build-helm.sh", f"echo {fake}/helm")
    # mke2fs -d writes a line on stdout even with -q: the path is the last line
    _stub(root / "scripts/build-v2node.sh", f"echo 6.1 >{fake}/kernel-version; echo Creating regular file; echo {fake}")
    _stub(fake / "kube", "echo 'Client Version: v0'")
    _stub(fake / "helm", "echo v3")
    _stub(root / ".venv/bin/python", "")  # pip and the demo itself
    bin_dir = tmp / "bin"
    _stub(bin_dir / "id", "echo 0")
    _stub(bin_dir / "dpkg-query", "echo 'install ok installed'")
    _stub(bin_dir / "apt-get", "exit 1")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "RHP_CALLS": str(tmp / "calls"), "RHP_LOCK_DIR": str(tmp),
           "RHP_SKIP_EXTRA_CONTAINERD": "1", "HOME": str(tmp)}
    return root, env


def _run(root: Path, env: dict[str, str], *argv: str) -> tuple[list[str], set[str]]:
    """What the run called (``id``, ``dpkg-query`` and ``python -V`` left out) and the Debian
    packages it checked."""
    calls = Path(env["RHP_CALLS"])
    calls.unlink(missing_ok=True)
    proc = subprocess.run(["bash", *argv], cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = calls.read_text().splitlines()
    packages = {line.split()[-1] for line in lines if line.startswith("dpkg-query ")}
    return [line.strip() for line in lines
            if line.split()[0] not in ("id", "dpkg-query") and line.strip() != "python -V"], packages  # fmt: skip


def test_the_demo_installs_the_package_and_builds_nothing_only_the_tests_need(tmp_path: Path) -> None:
    root, env = _checkout(tmp_path)
    env.pop("RHP_SKIP_EXTRA_CONTAINERD")  # --demo alone keeps containerd 1.7 and 2.1 out
    calls, packages = _run(root, env, "scripts/demo.sh", "--transport", "grpc")
    assert calls == ["python -m pip install -q -e . -e ./devenv", "python -m rhp_devenv.demo --transport grpc"]
    assert {"containerd", "runc", "busybox-static"} <= packages
    assert not packages & {"qemu-system-x86", "mmdebstrap", "umoci"}
    # A second demo finds its .venv ready.
    assert _run(root, env, "scripts/demo.sh")[0] == ["python -m rhp_devenv.demo"]


def test_the_test_set_up_installs_the_dev_tools_and_runs_every_build(tmp_path: Path) -> None:
    root, env = _checkout(tmp_path)
    _run(root, env, "scripts/install-deps.sh", "--demo")
    calls, packages = _run(root, env, "scripts/install-deps.sh")
    assert calls[0] == "python -m pip install -q -e .[dev] -e ./devenv"  # over the demo's .venv
    assert [c.split()[0] for c in calls[1:]] == ["build-critest.sh", "build-kube.sh", "kube", "build-helm.sh", "helm",
                                                 "build-v2node.sh"]  # fmt: skip
    assert {"qemu-system-x86", "mmdebstrap", "umoci"} <= packages


def test_the_demo_tells_the_time_of_each_step_and_keeps_the_demos_exit_code(tmp_path: Path) -> None:
    root, env = _checkout(tmp_path)
    _stub(root / ".venv/bin/python", 'if [[ $1 == -m && $2 == rhp_devenv.demo ]]; then exit 3; fi')
    proc = subprocess.run(["bash", "scripts/demo.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=120,
                          check=False, stdin=subprocess.DEVNULL)  # fmt: skip
    assert proc.returncode == 3, proc.stdout + proc.stderr
    told = [line for line in proc.stderr.splitlines() if line.startswith("demo.sh: ")]
    assert len(told) == 2, proc.stderr
    assert told[0].startswith("demo.sh: set-up took ") and told[0].endswith(" s")
    assert told[1].startswith("demo.sh: demo took ") and "(exit 3)" in told[1] and told[1].endswith(" s in all")
