"""Liveness of what a component needs from the API server, for its ``/healthz``.

A check is a callable returning ``(alive, why)`` (``rhp_kube.watch.Informer.liveness`` is one);
``all_of`` combines a component's checks. ``DEAD_AFTER`` is the default bound: a watch that has
heard nothing from the API server (no event, bookmark, end of stream or list) for that long is
dead or stale, and ``/healthz`` answers 503 so that kubelet restarts the component. It is well
above a healthy watch's quiet time (the API server ends every stream after ``timeoutSeconds``,
60 s by default, and sends bookmarks in between) and above a watch's read deadline, after which
a silent stream is cut and resumed. Standard library only: command lines import it for their
defaults without the extras installed.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["DEAD_AFTER", "Liveness", "all_of"]

DEAD_AFTER = 300.0

Liveness = Callable[[], tuple[bool, str]]


def all_of(*checks: Liveness | None) -> Liveness:
    """Alive when every check is; a check that raises counts as dead (with its error)."""
    present = [c for c in checks if c is not None]

    def check() -> tuple[bool, str]:
        bad = []
        for c in present:
            try:
                alive, why = c()
            except Exception as exc:
                alive, why = False, f"liveness check failed: {type(exc).__name__}: {exc}"
            if not alive:
                bad.append(why)
        return (False, "; ".join(bad)) if bad else (True, "ok")

    return check
