"""docs/metrics.md is what scripts/gen-metrics-doc.py makes from the code today: a metric added,
renamed or re-labelled without regenerating the reference fails here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_metrics_reference_is_current() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "devenv")])}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-metrics-doc.py"), "--check"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:] + "\nrun: python scripts/gen-metrics-doc.py"


def test_the_reference_lists_the_proxy_the_extender_the_manager_and_the_events() -> None:
    text = (ROOT / "docs" / "metrics.md").read_text()
    for name in ("rhp_cri_call_duration_seconds", "rhp_plugin_errors_total", "scheduler_ext_verb_requests_total",
                 "rhp_manager_writes_total", "rhp_pod_events_total", "rhp_build_info"):
        assert f"| `{name}` |" in text, name
