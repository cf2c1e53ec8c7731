"""The manager's tests run its command line, which configures structlog for the process (as
``rhp_ops.logs.configure`` does for every command): give each later test the defaults back, so
the tests that capture logs elsewhere do not depend on running before these."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()
