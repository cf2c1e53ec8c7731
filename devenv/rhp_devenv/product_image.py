"""The product's own images (``packaging/image/build.sh``), built once per source tree and cached.

Tests and the cluster harness need the node and cluster images of the tree under test. A build
takes minutes (mmdebstrap, the venvs), so :func:`product_images` keys the result by a hash of every
input the build reads (the shipped packages, ``pyproject.toml``, ``packaging/image/``,
``packaging/lib/`` and the pinned requirement files) and keeps it under
``/var/cache/runtime-hook-proxy/images/<key>/``: a second run on the same tree, or another test in
the same run, reuses it; a changed tree builds again (older keys are removed, the newest two stay).
:func:`kube_scheduler_image` makes the upstream kube-scheduler image offline from the multi-call
binary the harness already runs (``scripts/build-kube.sh``), and :func:`import_archive` loads an
OCI archive into a containerd's ``k8s.io`` namespace.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CACHE",
    "ProductImage",
    "import_archive",
    "inputs_key",
    "kube_scheduler_image",
    "product_images",
]

REPO = Path(__file__).resolve().parents[2]
CACHE = Path("/var/cache/runtime-hook-proxy/images")
SHIPPED = ("runtime_proxy", "hooks", "scheduler_ext", "cri_protos", "koord_formats", "rhp_ops", "rhp_kube")
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "packaging/image", "packaging/lib",
                "packaging/deb/requirements.txt", "packaging/deb/build-requirements.txt",
                "packaging/helm/runtime-hook-proxy/values.yaml")  # the images' names (packaging/image/refs.py)


@dataclass(frozen=True)
class ProductImage:
    """One built image: its flavour (``node`` or ``cluster``), archive and reference."""

    flavour: str
    archive: Path
    ref: str


def _files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def inputs_key(repo: Path = REPO) -> str:
    """A hash of every file the image build reads, with its path."""
    digest = hashlib.sha256()
    for name in (*SHIPPED, *BUILD_INPUTS):
        for path in _files(repo / name):
            digest.update(str(path.relative_to(repo)).encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _read_lines(out: str) -> dict[str, ProductImage]:
    images: dict[str, ProductImage] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("node", "cluster"):
            images[parts[0]] = ProductImage(parts[0], Path(parts[1]), parts[2])
    return images


def product_images(repo: Path = REPO, cache: Path = CACHE) -> dict[str, ProductImage]:
    """Both images of *repo*'s tree, from the cache or built now (as root; minutes when cold)."""
    key = inputs_key(repo)
    directory = cache / key
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = directory / "images.txt"
        if not done.is_file():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            env = {**os.environ, "RHP_IMAGE_OUT": str(directory)}
            env.pop("RHP_IMAGE_KEEP_WORK", None)
            proc = subprocess.run(["bash", str(repo / "packaging/image/build.sh")], env=env, text=True,
                                  capture_output=True, stdin=subprocess.DEVNULL, timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"packaging/image/build.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
            done.write_text(proc.stdout)
            entries = sorted((p for p in cache.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
            for old in entries[:-2]:
                shutil.rmtree(old, ignore_errors=True)
        os.utime(directory)
        return _read_lines(done.read_text())


def kube_scheduler_image(kube: Path, version: str, out_dir: Path) -> ProductImage:
    """An OCI archive of upstream kube-scheduler: one layer with the static multi-call binary *kube*
    at ``/usr/local/bin/kube``, entry point ``kube kube-scheduler``, user 65532. Written by hand
    (a few hundred bytes of JSON around one layer), deterministic for a given binary."""
    ref = f"localhost/kube-scheduler:{version}"
    out_dir.mkdir(parents=True, exist_ok=True)
    archive = out_dir / f"kube-scheduler-{version}.oci.tar"
    if archive.is_file():
        return ProductImage("kube-scheduler", archive, ref)
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("usr", "usr/local", "usr/local/bin"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        info = tarfile.TarInfo("usr/local/bin/kube")
        info.size, info.mode = kube.stat().st_size, 0o755
        with open(kube, "rb") as f:
            tar.addfile(info, f)
    layer_bytes = layer.getvalue()
    layer_digest = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"User": "65532:65532", "Entrypoint": ["/usr/local/bin/kube", "kube-scheduler"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_digest}"]},
    }, sort_keys=True).encode()
    config_digest = hashlib.sha256(config).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": f"sha256:{config_digest}",
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": f"sha256:{layer_digest}",
                    "size": len(layer_bytes)}],
    }, sort_keys=True).encode()
    manifest_digest = hashlib.sha256(manifest).hexdigest()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": f"sha256:{manifest_digest}",
        "size": len(manifest),
        "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": version},
    }]}, sort_keys=True).encode()
    blobs = {layer_digest: layer_bytes, config_digest: config, manifest_digest: manifest}
    tmp = archive.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", index)
        for digest, data in sorted(blobs.items()):
            add(f"blobs/sha256/{digest}", data)
    tmp.rename(archive)
    return ProductImage("kube-scheduler", archive, ref)


def import_archive(ctr: Path, socket: Path, archive: Path, namespace: str = "k8s.io") -> None:
    """``ctr images import`` of *archive* into the containerd at *socket*."""
    proc = subprocess.run([str(ctr), "-a", str(socket), "-n", namespace, "images", "import", str(archive)],
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"ctr images import {archive} failed: {proc.stderr.strip()[-2000:]}")
