"""Shared pytest setup: markers, the root check and the Hypothesis profiles. Keep this file small.

- ``@pytest.mark.requires_root``: skipped (with the reason) when not running as root.
- ``@pytest.mark.integration`` (declared in pyproject.toml) is added to every test under
  ``tests/integration/``; the containerd fixtures there skip by themselves when not root.
- Hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE`` (default ``ci``, which
  ``scripts/test.sh`` and CI use): ``ci`` draws the same examples on every run
  (``derandomize``, ``CI_EXAMPLES`` of them unless a test sets its own count), with no deadline
  (a loaded 2-core machine is slow, not wrong) and the failing example's blob printed, so a
  property test is green or red by the code, never by a lucky draw. ``random`` draws new
  examples each run (Hypothesis's own defaults, no deadline), for hunting locally:
  ``HYPOTHESIS_PROFILE=random .venv/bin/pytest tests/hooks`` (README, "Tests").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import settings

CI_EXAMPLES = 100
settings.register_profile("ci", derandomize=True, max_examples=CI_EXAMPLES, deadline=None, print_blob=True)
settings.register_profile("random", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

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


@pytest.fixture(autouse=True)
def _structlog_defaults_after_each_test() -> Iterator[None]:
    """Command lines under test configure structlog for the process (``rhp_ops.logs.configure``:
    JSON, loggers cached on first use); give every later test the defaults back, so a test that
    captures logs never depends on which tests ran before it."""
    yield
    structlog.reset_defaults()
