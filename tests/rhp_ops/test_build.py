"""Build information (``rhp_ops.build``): the git commit of a checkout or a worktree, or of
``RHP_GIT_COMMIT``; nothing when unknown."""

from __future__ import annotations

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
