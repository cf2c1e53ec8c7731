"""Make ``tests/`` importable (``topologies``) and the plugin test factories (``factories``)."""

from __future__ import annotations

import sys
from pathlib import Path

for _dir in (Path(__file__).resolve().parent.parent, Path(__file__).resolve().parent):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))
