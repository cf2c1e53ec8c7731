"""Every shell command in ``README.md``, ``docs/*.md`` and ``packaging/*.md`` runs as written.

A shell block is a fenced block whose info string starts with ``sh`` (or ``bash``, ``shell``).
Each runs with ``bash -euo pipefail`` in a temporary directory that holds copies of the
repository's ``packaging/``, ``docs/`` and ``examples/`` and links to the rest, with the
project's virtualenv first on ``PATH`` and this checkout first on ``PYTHONPATH``; it must exit 0
within ``TIMEOUT`` seconds.

A block that cannot run here carries a second word in its info string (```` ```sh cluster ````)
naming why, one of ``REASONS``; ``SKIPPED`` lists each such block (file and first command) with
its reason, and the test fails when the list and the marks in the documents differ. Commands
outside shell blocks (an indented block, or a fence without an info string) fail the test too,
so no command escapes being run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 60
SHELLS = ("sh", "bash", "shell")

# Why a marked block does not run here.
REASONS = {
    "main": "one of the two main commands (root, installs packages, minutes); CI runs them itself",
    "host": "changes this machine as root (files under /etc, systemd units, kubelet) or needs a package index",
    "cluster": "needs a Kubernetes API server (kubectl apply/delete)",
    "node": "needs a containerd with NRI or a kubelet on this machine, and runs until stopped",
    "builder": "needs an OCI image builder (the docker CLI here has no daemon)",
    "slow": "a benchmark: minutes of load on real containerd",
}

# Every marked block: (document, first command) -> the reason (a key of REASONS).
SKIPPED: dict[tuple[str, str], str] = {
    ("README.md", "bash scripts/demo.sh"): "main",
    ("README.md", "bash scripts/test.sh"): "main",
    ("README.md", "bash scripts/test.sh tests/e2e"): "main",
    ("README.md", "bash packaging/deb/build.sh"): "host",
    ("README.md", "bash packaging/wheel/build.sh"): "host",
    ("README.md", "apt-get install -y mmdebstrap umoci"): "host",
    ("README.md",
     "podman build -f Containerfile --target node -t registry.example.com/runtime-hook-proxy-node:0.1.0 ."): "builder",
    ("README.md", "kubectl apply -k packaging/kustomize/overlays/extender"): "cluster",
    ("README.md",
     "helm install rhp packaging/helm/runtime-hook-proxy -n kube-system --set image.registry=registry.example.com"):
        "cluster",
    ("README.md", ".venv/bin/python benchmarks/proxy_overhead.py"): "slow",
    ("docs/nri.md", "runtime-proxy nri --nri-socket /var/run/nri/nri.sock \\"): "node",
    ("docs/v2-node.md", "bash scripts/build-v2node.sh"): "host",
    ("docs/v2-node.md", "bash scripts/test.sh tests/v2"): "main",
    ("docs/v2-node.md", "RHP_V2_KUBELET=1 bash scripts/test.sh tests/v2/test_v2_kubelet.py"): "host",
    ("packaging/kubelet.md", "apt-get install ./dist/runtime-hook-proxy_0.1.0_amd64.deb"): "host",
}

# First words that make a line a command, to find commands outside shell blocks.
COMMANDS = re.compile(r"^\s*(\$ )?(sudo |\.venv/bin/)?(runtime-proxy|scheduler-ext|kubectl|pip|python3?|bash|sh|"
                      r"install|systemctl|docker|podman|curl|cp|mkdir|cat|journalctl)( |$)")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*(.*)$")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    info: str
    text: str

    @property
    def first(self) -> str:
        return next(line.split("  #")[0].rstrip() for line in self.text.splitlines()
                    if line.strip() and not line.lstrip().startswith("#"))


def _documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "packaging").glob("*.md"))]


def _blocks(path: Path) -> tuple[list[Block], list[Block]]:
    """(fenced blocks, indented blocks) of one Markdown file."""
    lines = path.read_text().splitlines()
    name = str(path.relative_to(REPO))
    fenced: list[Block] = []
    indented: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match:
            indent, fence, info = match.groups()
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(fence):
                end += 1
            body = [line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end]]
            fenced.append(Block(name, i + 1, info.strip(), "\n".join(body)))
            i = end + 1
            continue
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            start = i
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                i += 1
            indented.append(Block(name, start + 1, "", "\n".join(line[4:] for line in lines[start:i])))
            continue
        i += 1
    return fenced, indented


def _all() -> tuple[list[Block], list[Block]]:
    fenced: list[Block] = []
    indented: list[Block] = []
    for path in _documents():
        f, ind = _blocks(path)
        fenced += f
        indented += ind
    return fenced, indented


FENCED, INDENTED = _all()
SHELL_BLOCKS = [b for b in FENCED if b.info.split()[:1] and b.info.split()[0] in SHELLS]
RUNNABLE = [b for b in SHELL_BLOCKS if len(b.info.split()) == 1]
MARKED = [b for b in SHELL_BLOCKS if len(b.info.split()) > 1]


def test_there_are_commands_to_run() -> None:
    assert len(RUNNABLE) >= 3


def test_no_command_sits_outside_a_shell_block() -> None:
    loose = [f"{b.doc}:{b.line}: {b.first}" for b in [*INDENTED, *(b for b in FENCED if not b.info)]
             if any(COMMANDS.match(line) for line in b.text.splitlines())]
    assert loose == [], "fence these as ```sh (or ```sh REASON when they cannot run here)"


def test_marked_blocks_and_the_skip_list_agree() -> None:
    marks = {}
    for b in MARKED:
        reason = b.info.split()[1]
        assert reason in REASONS, f"{b.doc}:{b.line}: unknown reason {reason!r}; use one of {sorted(REASONS)}"
        marks[(b.doc, b.first)] = reason
    assert marks == SKIPPED


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("docs")
    for entry in REPO.iterdir():
        if entry.name in (".git", "__pycache__"):
            continue
        if entry.name in ("packaging", "docs", "examples"):
            shutil.copytree(entry, work / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (work / entry.name).symlink_to(entry)
    return work


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.doc}:{b.line} {b.first}" for b in RUNNABLE])
def test_the_command_runs_as_written(block: Block, workdir: Path) -> None:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "HOME": str(workdir),
        "LANG": "C.UTF-8",
    }
    try:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.doc}:{block.line}: did not finish within {TIMEOUT} s")
    assert proc.returncode == 0, f"{block.doc}:{block.line}: exit {proc.returncode}\n{proc.stderr[-3000:]}"


def test_the_environment_has_the_commands() -> None:
    assert os.access(Path(sys.executable).parent / "runtime-proxy", os.X_OK)
