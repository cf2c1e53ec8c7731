"""Which Go the build scripts use (``packaging/lib/go.sh``), and that every caller finds the same
cached binary whatever its PATH.

Session 14's CI failed here: the machine had gained Debian's golang-go (Go 1.19 at /usr/bin/go)
beside /usr/local/go (1.26); install-deps.sh, with /usr/local/go/bin first on its PATH, built helm
under the key of Go 1.26, and docs/helm.md's ``build-helm.sh --print-path``, run by
tests/test_docs_commands.py with a short PATH, hashed Go 1.19 and printed a directory that did not
exist. The build scripts now take the newest Go of a fixed set, so the order of PATH does not
matter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIB = REPO / "packaging" / "lib" / "go.sh"


def _fake_go(directory: Path, version: str) -> Path:
    """A ``go`` that answers ``go env GOVERSION`` (and ``go env GOVERSION GOOS GOARCH``)."""
    directory.mkdir(parents=True, exist_ok=True)
    go = directory / "go"
    go.write_text(f"#!/bin/sh\n[ \"$1\" = env ] && printf '%s\\nlinux\\namd64\\n' '{version}' | head -n $(($# - 1))\n")
    go.chmod(0o755)
    return go


def _pick(path: str, minimum: str = "1.0", go: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "HOME": "/nonexistent"}
    if go is not None:
        env["GO"] = go
    return subprocess.run(["bash", "-c", f'source "{LIB}"; rhp_go {minimum}'], env=env, capture_output=True,
                          text=True, timeout=30, check=False)


# (what each `go` on PATH answers to `go env GOVERSION`, in PATH's order; which one is picked)
WINNERS = [
    (["go1.19.8", "go9.3.1"], 1),  # Debian's old Go first on PATH: the newer one still wins
    (["go9.3.1", "go1.19.8"], 0),
    (["go9.2.7", "go9.3rc1"], 1),  # a release candidate counts by its major and minor
    *(([answer, "go9.0.0"], 1) for answer in ("devel go1.99-abc", "", "go", "gox.y", "go1",
                                                "99999999999999999999999.1", "go99999999999.1")),
]


@pytest.mark.parametrize(("answers", "winner"), WINNERS)
def test_the_newest_go_wins_whatever_the_order_of_path(tmp_path: Path, answers: list[str], winner: int) -> None:
    gos = [_fake_go(tmp_path / f"go{i}", answer) for i, answer in enumerate(answers)]
    proc = _pick(":".join([*(str(go.parent) for go in gos), "/usr/bin", "/bin"]))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(gos[winner])


def test_go_from_the_environment_is_taken_as_given(tmp_path: Path) -> None:
    a = _fake_go(tmp_path / "a", "go9.3.1")
    proc = _pick(f"{a.parent}:/usr/bin:/bin", go="/opt/some/go")
    assert (proc.returncode, proc.stdout.strip()) == (0, "/opt/some/go")


def test_too_old_is_refused_with_the_reason(tmp_path: Path) -> None:
    a = _fake_go(tmp_path / "a", "go1.19.8")
    proc = _pick(f"{a.parent}:/usr/bin:/bin", minimum="98.0")
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "older than 98.0" in proc.stderr


def test_a_minimum_that_is_not_a_version_is_a_usage_error() -> None:
    proc = _pick("/usr/bin:/bin", minimum="latest")
    assert proc.returncode == 2
    assert "not a Go version" in proc.stderr


@pytest.mark.parametrize("script", ["build-helm.sh", "build-critest.sh"])
def test_print_path_is_the_same_with_an_old_go_first_on_a_short_path(tmp_path: Path, script: str) -> None:
    """The regression itself: the doc test's PATH with Debian's Go first finds what install-deps.sh
    built."""
    if not (shutil.which("go") or Path("/usr/local/go/bin/go").exists()):
        pytest.skip("no Go toolchain on this machine")
    old = _fake_go(tmp_path / "usr-bin", "go1.19.8")
    base = {k: v for k, v in os.environ.items() if k not in ("GO", "GOTOOLCHAIN")}
    runs = [
        subprocess.run(["bash", str(REPO / "scripts" / script), "--print-path"], env=env, capture_output=True,
                       text=True, timeout=60, check=False)
        for env in (base, {**base, "PATH": f"{old.parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path)})
    ]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert runs[0].stdout == runs[1].stdout
