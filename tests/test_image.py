"""The images of ``packaging/image/build.sh``: what they hold, what they weigh, and that they run.

Built once per source tree (``rhp_devenv.product_image``; minutes when cold, cached under
``/var/cache/runtime-hook-proxy/images/``), from Debian's packages and PyPI's pinned wheels only.
The size budget is checked on the uncompressed layers (what a node stores) and the compressed
archive (what a registry serves); ``test_sizes_are_reported`` prints both.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rhp_devenv.containerd import PrivateContainerd, available_versions
from rhp_devenv.product_image import ProductImage, import_archive, product_images

REPO = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024
# Budgets: about 15 % above what was measured when the images were first built: node 345 MiB
# uncompressed (Debian's minbase with python3 170, the venv 204 of which the kubernetes client is
# 126), a 90 MiB archive; the scheduler layer about 9 MiB uncompressed.
NODE_UNCOMPRESSED_BUDGET = 400 * MiB
NODE_ARCHIVE_BUDGET = 115 * MiB
SCHEDULER_LAYER_BUDGET = 16 * MiB
EXTENDER_ONLY = ("starlette", "uvicorn", "httptools", "h11", "anyio", "click")

pytestmark = pytest.mark.skipif(
    subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() != "0",
    reason="building an image needs root (mmdebstrap's root mode)",
)


@pytest.fixture(scope="module")
def images() -> dict[str, ProductImage]:
    return product_images()


class Layout:
    """An OCI archive read in memory: its manifest, config and layers' member names and sizes."""

    def __init__(self, archive: Path) -> None:
        self.archive = archive
        with tarfile.open(archive) as tar:
            self.blobs = {m.name.rsplit("/", 1)[-1]: m for m in tar.getmembers() if "/blobs/sha256/" in f"/{m.name}"}
            index = json.load(tar.extractfile(self._member(tar, "index.json")))  # type: ignore[arg-type]
            self.manifest = self._json(tar, index["manifests"][0]["digest"])
            self.config = self._json(tar, self.manifest["config"]["digest"])
            self.layers: list[dict[str, int]] = []
            for layer in self.manifest["layers"]:
                raw = tar.extractfile(self.blobs[layer["digest"].split(":")[1]])
                assert raw is not None
                data = raw.read()
                if data[:2] == b"\x1f\x8b":
                    data = gzip.decompress(data)
                with tarfile.open(fileobj=__import__("io").BytesIO(data)) as inner:
                    self.layers.append({m.name.removeprefix("./"): m.size for m in inner.getmembers()})

    @staticmethod
    def _member(tar: tarfile.TarFile, name: str) -> tarfile.TarInfo:
        for candidate in (name, f"./{name}"):
            try:
                return tar.getmember(candidate)
            except KeyError:
                continue
        raise KeyError(name)

    def _json(self, tar: tarfile.TarFile, digest: str) -> Any:
        f = tar.extractfile(self.blobs[digest.split(":")[1]])
        assert f is not None
        return json.load(f)

    def names(self) -> set[str]:
        return {name for layer in self.layers for name in layer}

    def uncompressed(self) -> int:
        return sum(sum(layer.values()) for layer in self.layers)


@pytest.fixture(scope="module")
def layouts(images: dict[str, ProductImage]) -> dict[str, Layout]:
    return {flavour: Layout(image.archive) for flavour, image in images.items()}


SITE = "opt/runtime-hook-proxy/venv/lib/python3.11/site-packages"


def test_node_image_holds_no_extender_dependency(layouts: dict[str, Layout]) -> None:
    names = layouts["node"].names()
    assert f"{SITE}/runtime_proxy/__init__.py" in names
    assert f"{SITE}/kubernetes/__init__.py" in names, "the node agent's fromCluster watch needs the client"
    present = [pkg for pkg in EXTENDER_ONLY if f"{SITE}/{pkg}/__init__.py" in names]
    assert present == []
    cluster = layouts["cluster"].names()
    assert [pkg for pkg in EXTENDER_ONLY if f"{SITE}/{pkg}/__init__.py" not in cluster] == []


@pytest.mark.parametrize("flavour", ["node", "cluster"])
def test_no_pip_no_apt_and_a_non_root_user(layouts: dict[str, Layout], flavour: str) -> None:
    layout = layouts[flavour]
    names = layout.names()
    assert [n for n in names if "/pip/" in f"/{n}/" or n.endswith("/bin/pip") or "/ensurepip/" in f"/{n}"] == []
    assert [n for n in names if n.startswith(("usr/bin/apt", "etc/apt/", "var/lib/apt/"))] == []
    config = layout.config["config"]
    assert config["User"] == "65532:65532"
    assert "Entrypoint" not in config or not config["Entrypoint"]
    assert layout.config["os"] == "linux" and layout.config["architecture"] == "amd64"


def test_the_cluster_image_shares_the_node_image_layers(layouts: dict[str, Layout]) -> None:
    node = [layer["digest"] for layer in layouts["node"].manifest["layers"]]
    cluster = [layer["digest"] for layer in layouts["cluster"].manifest["layers"]]
    assert cluster[: len(node)] == node
    assert len(cluster) == len(node) + 1


def test_size_budget(layouts: dict[str, Layout], images: dict[str, ProductImage]) -> None:
    node = layouts["node"]
    scheduler_layer = sum(layouts["cluster"].layers[-1].values())
    print(f"\nnode image: {node.uncompressed() / MiB:.0f} MiB uncompressed, "
          f"{images['node'].archive.stat().st_size / MiB:.0f} MiB archive; "
          f"cluster image adds {scheduler_layer / MiB:.1f} MiB "
          f"({images['cluster'].archive.stat().st_size / MiB:.0f} MiB archive)")
    assert node.uncompressed() <= NODE_UNCOMPRESSED_BUDGET
    assert images["node"].archive.stat().st_size <= NODE_ARCHIVE_BUDGET
    assert scheduler_layer <= SCHEDULER_LAYER_BUDGET


@pytest.fixture(scope="module")
def containerd() -> Iterator[PrivateContainerd]:
    versions = available_versions()
    if not versions:
        pytest.skip("no containerd (scripts/install-deps.sh)")
    with PrivateContainerd(versions[-1]) as ctrd:
        yield ctrd


def _run(ctrd: PrivateContainerd, ref: str, name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    ctr = [str(ctrd.binaries.ctr), "-a", str(ctrd.socket), "-n", "k8s.io"]
    return subprocess.run([*ctr, "run", "--rm", ref, name, *argv], capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)


def test_both_images_run_in_containerd_as_their_user(images: dict[str, ProductImage],
                                                      containerd: PrivateContainerd) -> None:
    for image in images.values():
        import_archive(containerd.binaries.ctr, containerd.socket, image.archive)
    node = _run(containerd, images["node"].ref, "node-check", "sh", "-c",
                "id -u; runtime-proxy --version; python3 -c 'import starlette' 2>&1 | tail -n1")
    assert node.returncode == 0, node.stderr
    lines = node.stdout.splitlines()
    assert lines[0] == "65532"
    assert lines[1].startswith("runtime-proxy ")
    assert re.search(r", commit [0-9a-f]{12}\)$", lines[1]), lines[1]  # the build's commit, baked into the wheel
    assert "No module named 'starlette'" in lines[2]
    cluster = _run(containerd, images["cluster"].ref, "cluster-check", "sh", "-c",
                   "id -u; scheduler-ext --version; scheduler-ext --help >/dev/null && echo help-ok")
    assert cluster.returncode == 0, cluster.stderr
    assert cluster.stdout.splitlines()[0] == "65532"
    assert cluster.stdout.splitlines()[1].startswith("scheduler-ext ")
    assert re.search(r", commit [0-9a-f]{12}\)$", cluster.stdout.splitlines()[1])
    assert cluster.stdout.splitlines()[2] == "help-ok"


def test_the_containerfile_builds_the_same_layout() -> None:
    text = (REPO / "Containerfile").read_text()
    assert "/opt/runtime-hook-proxy/venv" in text
    assert "USER 65532" in text
    for target in ("AS node", "AS cluster"):
        assert target in text
    for req in ("packaging/deb/requirements.txt", "packaging/image/requirements-cluster.txt",
                "packaging/image/requirements-scheduler.txt"):
        assert req in text
    assert "--require-hashes" in text
