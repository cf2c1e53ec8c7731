"""The private directory of a harness object that is started and stopped (a containerd, a
cluster): the one it was asked to use, or a new one under ``/tmp``, made when it starts."""

from __future__ import annotations

import tempfile
from pathlib import Path

__all__ = ["PrivateDir"]


class PrivateDir:
    """``work_dir`` for a class that sets ``_requested_work_dir`` in its constructor and calls
    :meth:`_make_work_dir` when it starts (``_work_dir`` is None until then)."""

    _requested_work_dir: Path | None = None
    _work_dir: Path | None = None

    @property
    def work_dir(self) -> Path:
        """The private directory; only valid after :meth:`start`."""
        if self._work_dir is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return self._work_dir

    def _make_work_dir(self, prefix: str) -> Path:
        """The requested directory (made when missing), else a new ``/tmp/<prefix>...``."""
        if self._requested_work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        else:
            self._work_dir = self._requested_work_dir
            self._work_dir.mkdir(parents=True, exist_ok=True)
        return self._work_dir
