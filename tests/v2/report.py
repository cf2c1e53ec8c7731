"""Lines for the v2 tier's terminal summary (``tests/v2/conftest.py`` prints them): the per-plugin
tables, the boot time and eth0's transmit counters. One module, so the conftest and the tests
share the list whatever name pytest gives the conftest."""

from __future__ import annotations

REPORT: list[str] = []
