"""``--baseline NAME=TREE`` for the benchmarks that start the product as child processes
(proxy_overhead.py, nri_overhead.py, extender_scale.py): the same child started from another
source tree (for example ``git worktree add /tmp/base COMMIT``) as a second arm, measured in the
same run as ours, round by round in alternating order, and reported as per-round ratios
ours / NAME with their median and spread [min, max].

Only the product's code comes from TREE; the benchmark, its harness (tests/, rhp_devenv) and
this interpreter's installed dependencies are ours. The child is started through ``env`` with
``PYTHONPATH`` set to TREE (and TREE/devenv) and ``PYTHONSAFEPATH=1``, so neither our checkout
(the venv's editable install comes after PYTHONPATH) nor the working directory (``python -m``
would put it first on the path) is imported instead. ``check()`` asks a child started that
way where it imports the packages from and refuses to run a baseline that would be ours.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Baseline:
    name: str
    tree: Path

    def env(self) -> dict[str, str]:
        """The environment variables a child of this tree needs (on top of ours)."""
        return {"PYTHONPATH": f"{self.tree}:{self.tree / 'devenv'}", "PYTHONSAFEPATH": "1"}

    def wrapper(self) -> list[str]:
        """A command prefix that runs the rest of the command line with this tree's code."""
        return ["env", *(f"{k}={v}" for k, v in self.env().items())]

    def check(self, *packages: str) -> None:
        """Exit with a message unless a child started through ``wrapper()`` imports every one of
        *packages* from this tree."""
        code = "import importlib, sys\nfor p in sys.argv[1:]: print(importlib.import_module(p).__file__)"
        out = subprocess.run([*self.wrapper(), sys.executable, "-c", code, *packages], capture_output=True,
                             text=True, check=False, stdin=subprocess.DEVNULL)  # fmt: skip
        files = out.stdout.split()
        if out.returncode != 0 or len(files) != len(packages):
            sys.exit(f"--baseline {self.name}={self.tree}: cannot import {', '.join(packages)} there:\n{out.stderr}")
        for package, file in zip(packages, files, strict=True):
            if not Path(file).resolve().is_relative_to(self.tree):
                sys.exit(f"--baseline {self.name}={self.tree}: {package} would come from {file}, not from that tree")
        print(f"baseline {self.name}: {', '.join(packages)} from {self.tree}")


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", type=parse, metavar="NAME=TREE",
                        help="also run the product code of source tree TREE as arm NAME, interleaved with ours "
                             "round by round, and print the per-round ratios ours / NAME")  # fmt: skip


def parse(value: str) -> Baseline:
    name, sep, tree = value.partition("=")
    if not sep or not name or not tree:
        raise argparse.ArgumentTypeError(f"expected NAME=TREE, got {value!r}")
    path = Path(tree).resolve()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{tree} is not a directory")
    return Baseline(name, path)


def orders(arms: Sequence[T], rounds: int) -> Iterator[tuple[int, list[T]]]:
    """(round, arms in that round's order): forward in even rounds, reversed in odd ones, so
    neither arm always runs first (on a warmer or a more loaded machine)."""
    for rnd in range(rounds):
        yield rnd, list(arms) if rnd % 2 == 0 else list(arms)[::-1]


def spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """median [min, max]"""
    if not values:
        return "n/a"
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def ratio_table(base: str, ours: str, measures: dict[str, tuple[Sequence[float], Sequence[float]]]) -> None:
    """For each measure, (our per-round values, the baseline's): the per-round ratios ours / base,
    their median and [min, max]. A ratio is within the run's noise when the spread holds 1.0."""
    print(f"\n{ours} / {base}, per round (same run, alternating order); median [min, max]")
    print(f"| measure | {ours} (median) | {base} (median) | ratio per round | ratio median [min, max] |")
    print("|---|---|---|---|---|")
    for label, (mine, theirs) in measures.items():
        ratios = [m / t for m, t in zip(mine, theirs, strict=True) if t]
        if not ratios:
            continue
        print(
            f"| {label} | {statistics.median(mine):.3f} | {statistics.median(theirs):.3f} | "
            f"{' '.join(f'{r:.3f}' for r in ratios)} | {spread(ratios)} |"
        )
