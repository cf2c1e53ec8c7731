"""Build a tiny OCI image from busybox-static, offline, and import it into a containerd.

No registry is reachable on our machines, so the development environment makes its own image:
one uncompressed layer holding ``/bin/busybox`` and a hard link per applet (``sh``, ``sleep``,
...), a config whose default command sleeps forever, and an OCI image layout archive whose index
names the image through the ``io.containerd.image.name`` annotation. The same image serves as the
pod sandbox (pause) image and as the workload image.

:class:`~rhp_devenv.containerd.PrivateContainerd` calls :func:`import_image`; tests may
call :func:`build_image_archive` directly. Building takes a few hundred milliseconds and the
result is cached per process.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BUSYBOX",
    "DEFAULT_IMAGE",
    "BuiltImage",
    "build_image_archive",
    "import_image",
]

DEFAULT_IMAGE = "localhost/rhp-busybox:1"
"""The image reference used as sandbox (pause) image and workload image."""

BUSYBOX = Path("/bin/busybox")
"""The statically linked busybox (Debian package ``busybox-static``)."""

_LAYOUT_MEDIA = {
    "index": "application/vnd.oci.image.index.v1+json",
    "manifest": "application/vnd.oci.image.manifest.v1+json",
    "config": "application/vnd.oci.image.config.v1+json",
    "layer": "application/vnd.oci.image.layer.v1.tar",
}
_DIRS = ("bin", "dev", "etc", "proc", "root", "run", "sys", "tmp", "var", "var/tmp")
_ETC_FILES = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
}
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}

_cache_lock = threading.Lock()
_archive_cache: dict[tuple[str, str], bytes] = {}


@dataclass(frozen=True)
class BuiltImage:
    """An image archive written to disk."""

    name: str
    """The reference the import will create (``localhost/rhp-busybox:1``)."""
    archive: Path
    """The OCI image layout tar file."""
    manifest_digest: str
    """``sha256:...`` of the image manifest."""


def _goarch() -> str:
    machine = platform.machine()
    return _GOARCH.get(machine, machine)


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run(
        [str(busybox), "--list"], check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL
    ).stdout
    return sorted({name for name in out.split() if name and "/" not in name and name != "busybox"})


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    tar.addfile(info)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


def _layer_tar(busybox: Path) -> bytes:
    """The single rootfs layer: directories, /etc basics, busybox and one hard link per applet."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in _DIRS:
            _add_dir(tar, name, 0o1777 if name in ("tmp", "var/tmp") else 0o755)
        for name, text in _ETC_FILES.items():
            _add_bytes(tar, name, text.encode())
        _add_bytes(tar, "bin/busybox", busybox.read_bytes(), 0o755)
        for applet in _applets(busybox):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.LNKTYPE
            link.linkname = "bin/busybox"
            link.mode = 0o755
            tar.addfile(link)
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _json(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _archive_bytes(name: str, busybox: Path) -> bytes:
    """The whole OCI image layout as an uncompressed tar, deterministic for a given busybox."""
    layer_digest, layer = _blob(_layer_tar(busybox))
    arch = _goarch()
    config_digest, config = _blob(
        _json(
            {
                "architecture": arch,
                "os": "linux",
                "config": {
                    "Env": ["PATH=/bin"],
                    "Cmd": ["/bin/sleep", "inf"],
                    "WorkingDir": "/",
                },
                "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
                "history": [{"created_by": "rhp_devenv.image (busybox-static)"}],
            }
        )
    )
    manifest_digest, manifest = _blob(
        _json(
            {
                "schemaVersion": 2,
                "mediaType": _LAYOUT_MEDIA["manifest"],
                "config": {"mediaType": _LAYOUT_MEDIA["config"], "digest": config_digest, "size": len(config)},
                "layers": [{"mediaType": _LAYOUT_MEDIA["layer"], "digest": layer_digest, "size": len(layer)}],
            }
        )
    )
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": _LAYOUT_MEDIA["index"],
            "manifests": [
                {
                    "mediaType": _LAYOUT_MEDIA["manifest"],
                    "digest": manifest_digest,
                    "size": len(manifest),
                    "platform": {"architecture": arch, "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add_bytes(tar, "index.json", index)
        _add_dir(tar, "blobs")
        _add_dir(tar, "blobs/sha256")
        for digest, data in ((layer_digest, layer), (config_digest, config), (manifest_digest, manifest)):
            _add_bytes(tar, f"blobs/sha256/{digest.split(':', 1)[1]}", data)
    return buf.getvalue()


def build_image_archive(dest: Path, *, name: str = DEFAULT_IMAGE, busybox: Path = BUSYBOX) -> BuiltImage:
    """Write the busybox OCI image layout archive to *dest* (a ``.tar`` file path).

    :param dest: file to write; its parent must exist.
    :param name: image reference recorded in the index annotation ``io.containerd.image.name``.
    :param busybox: a statically linked busybox binary.
    :raises FileNotFoundError: when *busybox* is missing (install ``busybox-static``).
    """
    if not busybox.is_file():
        raise FileNotFoundError(f"{busybox} not found: install the Debian package busybox-static")
    key = (name, str(busybox))
    with _cache_lock:
        data = _archive_cache.get(key)
        if data is None:
            data = _archive_cache[key] = _archive_bytes(name, busybox)
    tmp = dest.with_name(dest.name + f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(dest)
    with tarfile.open(dest) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.load(member)
    return BuiltImage(name=name, archive=dest, manifest_digest=str(index["manifests"][0]["digest"]))


def import_image(
    ctr: Path,
    socket: Path,
    archive: Path,
    *,
    namespace: str = "k8s.io",
    timeout: float = 60.0,
) -> None:
    """Import an OCI archive with ``ctr -a SOCKET -n NAMESPACE images import ARCHIVE``.

    Use the ``ctr`` that ships with the containerd behind *socket*. The image is unpacked for the
    default snapshotter, so the CRI plugin can use it at once.

    :raises RuntimeError: when ``ctr`` fails; the message carries its output.
    """
    cmd = [str(ctr), "-a", str(socket), "-n", namespace, "images", "import", str(archive)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} failed with exit code {proc.returncode}: {proc.stderr.strip() or proc.stdout}"
        )
