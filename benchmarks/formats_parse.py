"""Cost of one parse per Koordinator format, and of a memo hit, against a baseline tree's
parsers measured in the same process (speed is reported here, never asserted in tests).

The baseline is a ``hooks/facts.py`` from another tree (before ``koord_formats`` existed it held
the proxy's parsers); its parse functions are loaded from that file alone. Hostile rows run only
on ``koord_formats`` (the old parsers take seconds or raise RecursionError on them).

    python benchmarks/formats_parse.py [--baseline OLD_TREE/hooks/facts.py] [--rounds 2000]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from koord_formats import FormatError, cpulist, keys, pod, quantity  # noqa: E402

STATUS = '{"cpuset":"2-5,54-57","numaNodeResources":[{"node":0,"resources":{"cpu":"4","memory":"8Gi"}}]}'
ONE_BY_ONE = ",".join(str(i) for i in range(4096))
HOSTILE = {
    "resource-status 3000 open brackets": "[" * 3000,
    "resource-status cpu 1e9999999": '{"numaNodeResources":[{"node":0,"resources":{"cpu":"1e9999999"}}]}',
    "resource-status 160 KB cpuset": '{"cpuset":"' + "0-16383," * 20000 + '"}',
}


def per_call_us(fn: Callable[[], Any], rounds: int) -> float:
    """Median of five batches, microseconds per call."""
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            fn()
        samples.append((time.perf_counter() - start) / rounds * 1e6)
    return statistics.median(samples)


def quietly(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    def call() -> Any:
        try:
            return fn(*args)
        except FormatError:
            return None

    return call


def load_baseline(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_facts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="a hooks/facts.py with parse_quantity, parse_cpu_list, ...")
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    old = load_baseline(args.baseline) if args.baseline else None
    uncached_status = pod.parse_resource_status.__wrapped__  # type: ignore[attr-defined]
    rows: list[tuple[str, Callable[[], Any], Callable[[], Any] | None]] = [
        ("quantity 500m", lambda: quantity.parse_quantity("500m"), old and (lambda: old.parse_quantity("500m"))),
        ("quantity 8Gi", lambda: quantity.parse_quantity("8Gi"), old and (lambda: old.parse_quantity("8Gi"))),
        ("cpu list 0-3,8-11", lambda: cpulist.parse_cpu_list("0-3,8-11"),
         old and (lambda: old.parse_cpu_list("0-3,8-11"))),
        ("cpu list 4096 ids one by one", lambda: cpulist.parse_cpu_list(ONE_BY_ONE),
         old and (lambda: old.parse_cpu_list(ONE_BY_ONE))),
        ("resource-status, parsed", lambda: uncached_status(STATUS),
         old and (lambda: old.parse_resource_status({keys.ANNOTATION_RESOURCE_STATUS: STATUS}))),
        ("resource-status, memo hit", lambda: pod.parse_resource_status(STATUS),
         old and (lambda: old.parse_resource_status({keys.ANNOTATION_RESOURCE_STATUS: STATUS}))),
    ]
    print(f"{'format':34} {'koord_formats us':>17} {'baseline us':>12} {'ratio':>7}")
    for name, new_fn, old_fn in rows:
        new_us = per_call_us(new_fn, args.rounds if "4096" not in name else 50)
        old_us = per_call_us(old_fn, args.rounds if "4096" not in name else 50) if old_fn else float("nan")
        print(f"{name:34} {new_us:17.2f} {old_us:12.2f} {new_us / old_us:7.2f}")
    for name, text in HOSTILE.items():
        us = per_call_us(quietly(uncached_status, text), 5)
        print(f"{name:34} {us:17.2f} {'(refused)':>12}")


if __name__ == "__main__":
    main()
