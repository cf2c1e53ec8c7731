"""``rhp_ops.files.read_regular_file``, the one reader of files named by configuration: a regular
file (or a symlink to one) is read; everything else is refused with a reason and never blocks."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rhp_ops.files import FileRefused, kubeconfig_files, read_regular_file, read_text_file
from tests.hostile_files import KINDS, plant


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory with a path short enough for a unix socket."""
    path = Path(f"/tmp/rhp-files-{os.getpid()}-{os.urandom(3).hex()}")
    path.mkdir()
    yield path
    for entry in sorted(path.rglob("*"), reverse=True):
        entry.rmdir() if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    path.rmdir()


EXPECTED = {
    "fifo": ("not-regular-file", "not a regular file: a FIFO"),
    "socket": ("not-regular-file", "not a regular file: a socket"),
    "device": ("not-regular-file", "not a regular file: a character device"),
    "directory": ("not-regular-file", "not a regular file: a directory"),
    "symlink-to-fifo": ("not-regular-file", "not a regular file: a FIFO"),
    "sparse-5g": ("too-large", "larger than 4096 bytes"),
}


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_files_are_refused_without_blocking(short: Path, kind: str) -> None:
    plant(kind, short / "config.yaml")
    with pytest.raises(FileRefused) as caught:
        read_regular_file(short / "config.yaml", limit=4096)
    assert (caught.value.reason, caught.value.message) == EXPECTED[kind]


def _regular(d: Path, data: bytes = b"a: 1\n") -> Path:
    (d / "real").write_bytes(data)
    return d / "real"


def _link(d: Path) -> Path:
    (d / "link").symlink_to(_regular(d))
    return d / "link"


@pytest.mark.parametrize(
    ("setup", "follow", "expected"),
    [
        pytest.param(_regular, True, b"a: 1\n", id="a regular file is read"),
        pytest.param(_link, True, b"a: 1\n", id="a symlink to a regular file is followed by default"),
        pytest.param(_link, False, "symlink", id="a symlink is refused when not following"),
        pytest.param(lambda d: d / "none", True, "missing", id="a missing file is missing"),
        pytest.param(lambda d: _regular(d, b"x" * 4097), True, "too-large", id="one byte over the limit is refused"),
        pytest.param(lambda d: _regular(d, b"x" * 4096), True, b"x" * 4096, id="exactly the limit is read"),
    ],
)
def test_regular_files(tmp_path: Path, setup: Callable[[Path], Path], follow: bool, expected: bytes | str) -> None:
    path = setup(tmp_path)
    if isinstance(expected, str):
        with pytest.raises(FileRefused) as caught:
            read_regular_file(path, limit=4096, follow_symlinks=follow)
        assert caught.value.reason == expected
    else:
        assert read_regular_file(path, limit=4096, follow_symlinks=follow) == expected


def test_a_file_that_reports_size_zero_is_still_bounded_while_read(tmp_path: Path) -> None:
    """/proc files report size 0 and can hold anything: the limit holds while reading."""
    with pytest.raises(FileRefused, match="larger than 16 bytes"):
        read_regular_file("/proc/self/status", limit=16)
    assert read_regular_file("/proc/self/status", limit=1 << 20).startswith(b"Name:")


def test_expect_names_the_file_the_caller_looked_at(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    with pytest.raises(FileRefused) as caught:
        read_regular_file(tmp_path / "a", limit=10, expect=os.stat(tmp_path / "b"))
    assert caught.value.reason == "replaced"


def test_text_must_be_utf8(tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(b"ok\xff")
    with pytest.raises(FileRefused, match="not UTF-8 at byte 2"):
        read_text_file(tmp_path / "bad", limit=10)
    (tmp_path / "good").write_text("é")
    assert read_text_file(tmp_path / "good", limit=10) == "é"


def test_head_returns_the_first_bytes_of_a_larger_file(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"0123456789")
    assert read_regular_file(tmp_path / "big", limit=4, head=True) == b"0123"
    assert read_regular_file("/proc/self/status", limit=5, head=True) == b"Name:"


def test_kubeconfig_files_are_those_the_client_would_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a", "b"):
        (tmp_path / name).write_text("")
    listed = f"{tmp_path / 'a'}:{tmp_path / 'missing'}:{tmp_path / 'b'}"
    assert kubeconfig_files(listed) == [str(tmp_path / "a"), str(tmp_path / "b")]
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "b"))
    assert kubeconfig_files(None) == [str(tmp_path / "b")]
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert kubeconfig_files(None) == []
