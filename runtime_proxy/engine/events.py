"""The reasons of the node agent's Events on pods. ``Lifecycle.run`` records one for every
failure of a stage about a pod through the ``EventSink`` it was given; the recorder is the one
Event recorder of the tree, ``rhp_kube.events.EventRecorder`` (spam filter per pod, node-wide
cap, aggregation), built by the composition root (``runtime_proxy.wiring.events``)."""

from __future__ import annotations

__all__ = ["REASON_FAILED", "REASON_REFUSED"]

# A hook failed and the call went on without it (policy Ignore, or a stage that cannot refuse).
REASON_FAILED = "RuntimeHookFailed"
# A Fail-policy hook failed and the call was refused.
REASON_REFUSED = "RuntimeHookRefused"
