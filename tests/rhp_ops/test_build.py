"""Build information (``rhp_ops.build``): the git commit of a checkout or a worktree, or of
``RHP_GIT_COMMIT``; nothing when unknown."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rhp_ops import build

SHA = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"


def _checkout(root: Path, head: str, refs: dict[str, str] | None = None, packed: str = "") -> Path:
    git = root / ".git"
    git.mkdir(parents=True)
    (git / "HEAD").write_text(head + "\n")
    for name, sha in (refs or {}).items():
        (git / name).parent.mkdir(parents=True, exist_ok=True)
        (git / name).write_text(sha + "\n")
    if packed:
        (git / "packed-refs").write_text(packed)
    return root


@pytest.mark.parametrize(
    ("head", "refs", "packed", "expected"),
    [
        pytest.param(SHA, None, "", SHA, id="a detached HEAD names the commit"),
        pytest.param("ref: refs/heads/main", {"refs/heads/main": SHA}, "", SHA, id="a branch ref file"),
        pytest.param("ref: refs/heads/main", None, f"# pack-refs\n{OTHER} refs/heads/other\n{SHA} refs/heads/main\n",
                     SHA, id="a packed ref"),
        pytest.param("ref: refs/heads/gone", None, "", "", id="a missing ref gives nothing"),
        pytest.param("garbage", None, "", "", id="a garbled HEAD gives nothing"),
    ],
)
def test_commit_of_a_checkout(tmp_path: Path, head: str, refs: dict[str, str] | None, packed: str,
                              expected: str) -> None:
    assert build._commit_in_checkout(_checkout(tmp_path, head, refs, packed)) == expected


def test_commit_of_a_worktree(tmp_path: Path) -> None:
    common = tmp_path / "main" / ".git"
    _checkout(tmp_path / "main", "ref: refs/heads/main", {"refs/heads/main": OTHER, "refs/heads/wt": SHA})
    wt_git = common / "worktrees" / "wt"
    wt_git.mkdir(parents=True)
    (wt_git / "HEAD").write_text("ref: refs/heads/wt\n")
    (wt_git / "commondir").write_text("../..\n")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text(f"gitdir: {wt_git}\n")
    assert build._commit_in_checkout(tmp_path / "wt") == SHA


def test_no_checkout_gives_nothing(tmp_path: Path) -> None:
    assert build._commit_in_checkout(tmp_path) == ""


def test_the_environment_names_the_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    build.git_commit.cache_clear()
    monkeypatch.setenv("RHP_GIT_COMMIT", SHA.upper())
    try:
        assert build.git_commit() == SHA
        assert build.build_info()["commit"] == SHA
        assert build.version_line("x").endswith(f", commit {SHA[:12]})")
    finally:
        build.git_commit.cache_clear()


def test_an_installed_wheel_names_the_commit_it_was_built_from(tmp_path: Path) -> None:
    """``rhp_ops/COMMIT`` (written by ``packaging/lib/venv.sh``'s ``rhp_build_wheel``) names the
    commit where no checkout is (site-packages); on the old main the .deb and the images named none."""
    site = tmp_path / "site-packages"
    (site / "rhp_ops").mkdir(parents=True)
    (site / "rhp_ops" / "__init__.py").write_text("")
    (site / "rhp_ops" / "build.py").write_text(Path(build.__file__).read_text())
    code = "from rhp_ops import build; print(build.git_commit())"
    env = {k: v for k, v in os.environ.items() if k != "RHP_GIT_COMMIT"}
    run = [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {code}"]
    assert subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout.strip() == ""
    (site / "rhp_ops" / "COMMIT").write_text(SHA + "\n")
    assert subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout.strip() == SHA
    (site / "rhp_ops" / "COMMIT").write_text("not a commit\n")
    assert subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout.strip() == ""


def test_the_missing_extra_is_named_with_the_wheel_to_install() -> None:
    hint = build.extra_hint("cluster")
    assert f"./dist/runtime_hook_proxy-{build.version()}-py3-none-any.whl[cluster]" in hint
    assert "packaging/wheel/build.sh" in hint
