"""Write the layer that turns one image tree into another: ``difflayer.py OLD NEW EPOCH OUT``.

Every regular file or symlink under NEW that is missing under OLD or differs from it goes into the
tar OUT with its parent directories, sorted, owned by root, every time set to EPOCH, so the same
trees always give the same bytes. Files present only under OLD are not removed (no whiteouts):
the trees this is used for (packaging/image/build.sh: a venv and the same venv with more packages)
only grow.
"""

from __future__ import annotations

import filecmp
import os
import sys
import tarfile
from pathlib import Path


def changed(old: Path, new: Path) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(new):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath, name)
            rel = path.relative_to(new)
            before = old / rel
            if path.is_symlink():
                if not before.is_symlink() or os.readlink(before) != os.readlink(path):
                    out.append(str(rel))
            elif not before.is_file() or before.is_symlink() or not filecmp.cmp(before, path, shallow=False):
                out.append(str(rel))
    return out


def write(new: Path, names: list[str], epoch: int, out: Path) -> None:
    members: set[str] = set()
    for name in names:
        parts = Path(name).parts
        for i in range(1, len(parts)):
            members.add(str(Path(*parts[:i])))
        members.add(name)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            info = tar.gettarinfo(str(new / name), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = epoch
            if info.isfile():
                with open(new / name, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print("usage: difflayer.py OLD NEW EPOCH OUT", file=sys.stderr)
        return 2
    old, new, epoch, out = Path(argv[1]), Path(argv[2]), int(argv[3]), Path(argv[4])
    write(new, changed(old, new), epoch, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
