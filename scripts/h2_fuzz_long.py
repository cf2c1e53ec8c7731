"""The long run of the relay's HTTP/2 fuzzer: ``python scripts/h2_fuzz_long.py [--examples N]``.

Runs ``tests/hostile/h2_machine.RelayH2Machine`` (the machine ``tests/hostile/test_h2_fuzz.py``
runs briefly) against one relay process in front of the transport suite's grpcio backend, for
``--examples`` sessions of up to ``--steps`` steps each, then prints what it did: sessions,
time, the relay's RSS at the start, its largest RSS after a session and its peak (VmHWM), the
limits hit, and whether the relay still answers. Exits 1 when the machine finds a failure
(hypothesis prints the shortest sequence of frames that shows it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "hostile")]

from h2_machine import RelayH2Machine  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402
from relay_attacks import RelayProcess, healthy_call  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=5000, help="fuzzed sessions (default 5000)")
    parser.add_argument("--steps", type=int, default=50, help="steps per session at most (default 50)")
    parser.add_argument("--rss-limit", type=float, default=64.0, help="allowed RSS growth in MiB (default 64)")
    parser.add_argument("--progress", type=int, default=1000, help="print the relay's RSS every N sessions")
    args = parser.parse_args()

    relay = RelayProcess()
    failed = False
    t0 = time.monotonic()
    try:
        healthy_call(relay.path)
        start = relay.stats()
        RelayH2Machine.relay = relay
        RelayH2Machine.baseline_kib = int(start["rss_kib"])
        RelayH2Machine.rss_limit_mib = args.rss_limit
        RelayH2Machine.progress_every = args.progress
        try:
            run_state_machine_as_test(
                RelayH2Machine,
                settings=settings(
                    max_examples=args.examples,
                    stateful_step_count=args.steps,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )
        except Exception as exc:  # the machine's failure, already printed by hypothesis
            failed = True
            print(f"FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        end = relay.stats()
        answers = relay.alive() and healthy_call(relay.path) == b"ping"
    finally:
        relay.close()
    hits = {k: int(v) for k, v in end.get("hits", {}).items() if v}
    print(f"sessions            {RelayH2Machine.examples} (up to {args.steps} steps each)")
    print(f"time                {time.monotonic() - t0:.1f} s")
    print(
        f"relay RSS           start {start['rss_kib'] / 1024:.1f} MiB, largest after a session "
        f"{RelayH2Machine.max_rss_kib / 1024:.1f} MiB, peak {end['hwm_kib'] / 1024:.1f} MiB"
    )
    print(f"limits hit          {hits}")
    print(f"relay still answers {answers}")
    return 1 if failed or not answers else 0


if __name__ == "__main__":
    sys.exit(main())
