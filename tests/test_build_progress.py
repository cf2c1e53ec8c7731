"""Long builds say what they are doing (issue 36, item 5): ``packaging/lib/progress.sh`` prints a
line per step with the seconds since the script started, a line every ``RHP_PROGRESS_EVERY``
seconds while a long command runs and one with how long it took, all on stderr, and each build
script (the image, the ``.deb``, the wheel, Kubernetes, critest and helm) runs its long steps
through it. On the old main the ``.deb`` and image builds were silent for minutes and the Go
builds printed one line before and one after."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^demo: \[ *(\d+)s\] (.*)$")

BUILDS = {
    "packaging/deb/build.sh": ("rhp_fetch_wheels", "rhp_make_venv", "dpkg-deb"),
    "packaging/image/build.sh": ("rhp_fetch_wheels", "mmdebstrap", "rhp_make_venv", "build_one"),
    "packaging/wheel/build.sh": ("rhp_fetch_wheels",),
    "scripts/build-kube.sh": ("compile",),
    "scripts/build-critest.sh": ("compile",),
    "scripts/build-helm.sh": ('"$GO" install',),
    "scripts/build-v2node.sh": ("fetch_kernel", "debstrap", "mkimage"),
}


def _bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    source = f"set -euo pipefail; RHP_PROGRESS_NAME=demo; source {REPO / 'packaging/lib/progress.sh'}\n"
    return subprocess.run(["bash", "-c", source + script], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **env}, check=False)


def test_a_step_and_a_long_command_are_told_with_the_elapsed_time() -> None:
    started = time.monotonic()
    proc = _bash('rhp_step "first"; rhp_run "waiting" sleep 2.2; echo result; rhp_done', RHP_PROGRESS_EVERY="1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "result\n"  # stdout stays the script's own
    lines = [LINE.match(line) for line in proc.stderr.splitlines()]
    assert all(lines), proc.stderr
    said = [m.group(2) for m in lines if m]
    assert said[0] == "first" and said[1] == "waiting" and said[-1] == "done"
    assert any(s.startswith("waiting: still running after ") for s in said), said
    assert any(re.fullmatch(r"waiting: took [23] s", s) for s in said), said
    seconds = [int(m.group(1)) for m in lines if m]
    assert seconds == sorted(seconds) and seconds[-1] >= 2
    assert time.monotonic() - started < 30  # the ticker's sleep held no pipe open


def test_a_failing_command_is_told_and_its_exit_code_kept() -> None:
    proc = _bash('rhp_run "breaking" sh -c "exit 3" || echo "rc=$?"')
    assert proc.stdout == "rc=3\n"
    assert re.search(r"breaking: failed after \d+ s \(exit 3\)$", proc.stderr, re.M), proc.stderr


@pytest.mark.parametrize("script", sorted(BUILDS))
def test_each_long_build_runs_its_long_steps_through_it(script: str) -> None:
    text = (REPO / script).read_text()
    assert "packaging/lib/progress.sh" in text and "RHP_PROGRESS_NAME=" in text
    runs = [line for line in re.sub(r"\\\n\s*", " ", text).splitlines() if "rhp_run " in line]
    for command in BUILDS[script]:
        assert any(command in line for line in runs), f"{script}: {command} does not run through rhp_run"
