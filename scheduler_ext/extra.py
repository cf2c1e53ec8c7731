"""Which of the extender's web and cluster dependencies (the ``runtime-hook-proxy[scheduler]``
extra) are absent: ``scheduler_ext.cli`` asks before ``serve`` imports them, ``scheduler_ext.entry``
names them. A leaf: it imports only ``rhp_ops.build``.
"""

from __future__ import annotations

from rhp_ops.build import SCHEDULER_EXTRA, missing_modules

__all__ = ["EXIT_MISSING_EXTRA", "REQUIRED", "missing"]

REQUIRED = SCHEDULER_EXTRA
EXIT_MISSING_EXTRA = 2


def missing() -> list[str]:
    """The extra's modules that cannot be found."""
    return missing_modules(REQUIRED)
