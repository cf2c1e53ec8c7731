"""docs/metrics.md is what scripts/gen-metrics-doc.py makes from the code today: a metric added,
renamed or re-labelled without regenerating the reference fails here."""

from __future__ import annotations

import json
import os
import re
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


DASHBOARD = ROOT / "packaging" / "grafana" / "runtime-hook-proxy.json"
_METRIC = re.compile(r"\b((?:rhp|scheduler_ext)_[a-z0-9_]+)\b")
_SERIES = ("_bucket", "_sum", "_count")


def _documented() -> dict[str, str]:
    """Name as scraped -> type, from docs/metrics.md's table."""
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (\w+) \|", (ROOT / "docs" / "metrics.md").read_text(), re.M)
    return dict(rows)


def test_the_dashboard_queries_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    documented = _documented()
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"]), "panel ids are unique"
    queried: set[str] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in _METRIC.findall(target["expr"]):
                base = next((name[: -len(s)] for s in _SERIES if name.endswith(s) and name[: -len(s)] in documented),
                            name)
                assert base in documented, f"{panel['title']}: {name} is no metric of ours (docs/metrics.md)"
                if base != name:
                    assert documented[base] == "histogram", f"{name}: only histograms have {name[len(base):]}"
                queried.add(base)
    # The answers to "what happened to my pod?" and the calls themselves are on it.
    assert {"rhp_pod_events_total", "rhp_plugin_errors_total", "rhp_cri_call_duration_seconds",
            "scheduler_ext_verb_requests_total"} <= queried
