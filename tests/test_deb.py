"""The node's systemd unit (``packaging/runtime-proxy.service``)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_unit_wants_containerd_without_requiring_it() -> None:
    """A containerd restart must not restart the proxy: Wants= and After=, never Requires=,
    BindsTo= or PartOf= (which propagate containerd's stop and restart)."""
    directives = [line for line in (REPO / "packaging/runtime-proxy.service").read_text().splitlines()
                  if line and not line.startswith("#")]
    assert {"After=containerd.service", "Wants=containerd.service"} <= set(directives)
    assert [line for line in directives if line.startswith(("Requires=", "BindsTo=", "PartOf="))] == []
