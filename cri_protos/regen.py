"""Regenerate, or check, the generated modules of :mod:`cri_protos`.

``python -m cri_protos.regen`` runs the same ``grpc_tools.protoc`` invocation as
``scripts/gen-protos.sh`` in a temporary directory and copies the results into the
package.  With ``--check`` nothing is written: the exit status is 1 when any
committed generated file differs from fresh output (or is missing), else 0.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

PACKAGE = "cri_protos"
PACKAGE_DIR = Path(__file__).resolve().parent
PROTOS: tuple[str, ...] = ("api.proto", "hookserver.proto", "nri.proto", "ttrpc.proto")
GENERATED_SUFFIXES: tuple[str, ...] = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_names() -> list[str]:
    """File names (inside the package) that protoc produces from :data:`PROTOS`."""
    return [proto.removesuffix(".proto") + suffix for proto in PROTOS for suffix in GENERATED_SUFFIXES]


def generate(package_dir: Path, out_root: Path) -> Path:
    """Generate the modules for the protos in ``package_dir`` under ``out_root``.

    The protos are copied to ``out_root/cri_protos/`` and protoc runs with
    ``out_root`` as include root and working directory, exactly like the shell
    script does at the repository root. Returns ``out_root/cri_protos``.
    """
    work_pkg = out_root / PACKAGE
    work_pkg.mkdir(parents=True, exist_ok=True)
    for proto in PROTOS:
        shutil.copyfile(package_dir / proto, work_pkg / proto)
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        ".",
        "--python_out=.",
        "--pyi_out=.",
        "--grpc_python_out=.",
        *(f"{PACKAGE}/{proto}" for proto in PROTOS),
    ]
    proc = subprocess.run(cmd, cwd=out_root, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"protoc failed ({proc.returncode}):\n{proc.stderr.strip()}")
    return work_pkg


def stale_files(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Names of generated files in ``package_dir`` that are missing or out of date."""
    with tempfile.TemporaryDirectory(prefix="cri-protos-") as tmp:
        fresh_dir = generate(package_dir, Path(tmp))
        stale: list[str] = []
        for name in generated_names():
            committed = package_dir / name
            if not committed.is_file() or committed.read_bytes() != (fresh_dir / name).read_bytes():
                stale.append(name)
        return stale


def regenerate(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Write fresh generated files into ``package_dir``; return the names that changed."""
    with tempfile.TemporaryDirectory(prefix="cri-protos-") as tmp:
        fresh_dir = generate(package_dir, Path(tmp))
        changed: list[str] = []
        for name in generated_names():
            data = (fresh_dir / name).read_bytes()
            target = package_dir / name
            if not target.is_file() or target.read_bytes() != data:
                target.write_bytes(data)
                changed.append(name)
        return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cri_protos.regen", description=__doc__)
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if the committed generated files are stale",
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_files()
            for name in stale:
                print(f"stale: {PACKAGE}/{name}", file=sys.stderr)
            if stale:
                print("run scripts/gen-protos.sh (or python -m cri_protos.regen)", file=sys.stderr)
                return 1
            return 0
        for name in regenerate():
            print(f"updated: {PACKAGE}/{name}")
        return 0
    except RuntimeError as exc:
        print(str(exc), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
