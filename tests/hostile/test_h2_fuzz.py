"""A short run of the structured HTTP/2 fuzzer (``h2_machine.RelayH2Machine``) against a relay
process in front of a real grpcio backend: the relay lives, another connection keeps working
after every example, and the relay's memory stays bounded. ``scripts/h2_fuzz_long.py`` runs
the same machine for longer and reports its figures.
"""

from __future__ import annotations

from h2_machine import RelayH2Machine
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from relay_attacks import RelayProcess, healthy_call


def test_relay_survives_fuzzed_http2_sessions() -> None:
    relay = RelayProcess()
    try:
        healthy_call(relay.path)
        RelayH2Machine.relay = relay
        RelayH2Machine.baseline_kib = int(relay.stats()["rss_kib"])
        run_state_machine_as_test(
            RelayH2Machine,
            settings=settings(
                max_examples=100,
                stateful_step_count=25,
                deadline=None,
                derandomize=False,
                suppress_health_check=list(HealthCheck),
            ),
        )
        assert relay.alive()
        assert healthy_call(relay.path) == b"ping"
    finally:
        relay.close()
