"""Shared pytest setup: markers and the root check. Keep this file small.

- ``@pytest.mark.requires_root``: skipped (with the reason) when not running as root.
- ``@pytest.mark.integration`` (declared in pyproject.toml) is added to every test under
  ``tests/integration/``; the containerd fixtures there skip by themselves when not root.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

IS_ROOT = os.geteuid() == 0
_INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_root: needs root (cgroups, mounts, containerd); skipped otherwise")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_root = pytest.mark.skip(reason="needs root: run as root (scripts/test.sh does)")
    for item in items:
        if _INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
        if not IS_ROOT and item.get_closest_marker("requires_root") is not None:
            item.add_marker(skip_root)
