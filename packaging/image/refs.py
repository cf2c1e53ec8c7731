"""The references the images are built under, from the chart's values: ``refs.py [VALUES...]``.

Image coordinates are set in one place, the ``image`` block of the Helm chart's values
(``packaging/helm/runtime-hook-proxy/values.yaml``: ``registry``, ``node.repository``,
``node.tag``, ``cluster.repository``, ``cluster.tag``), or of a values file of your own that
overrides some of them (the one you give ``helm install -f``; ``RHP_IMAGE_VALUES`` for
``packaging/image/build.sh``). Prints ``node REF`` and ``cluster REF``, each
``REGISTRY/REPOSITORY:TAG`` (the repository as it is when the registry is empty), exactly what
the chart's ``rhp.image`` template renders, so the
images built are the images the chart runs. Run by ``packaging/image/build.sh`` with the Python
of the venv it builds (PyYAML is a base dependency).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

CHART_VALUES = Path(__file__).resolve().parents[1] / "helm" / "runtime-hook-proxy" / "values.yaml"
FLAVOURS = ("node", "cluster")
MAX_VALUES_BYTES = 1 << 20


class RefsError(Exception):
    """A values file that cannot name the images (the message says why)."""


def _image_block(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            text = fh.read(MAX_VALUES_BYTES + 1)
    except OSError as exc:
        raise RefsError(f"{path}: {exc.strerror or exc}") from None
    if len(text) > MAX_VALUES_BYTES:
        raise RefsError(f"{path}: larger than {MAX_VALUES_BYTES} bytes")
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise RefsError(f"{path}: not YAML: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(doc, dict):
        raise RefsError(f"{path}: not a mapping of values")
    image = doc.get("image") or {}
    if not isinstance(image, dict):
        raise RefsError(f"{path}: image is not a mapping")
    return image


def _merged(values: list[Path]) -> dict[str, Any]:
    """The image block of the chart's values with each file's on top, as Helm merges them."""
    merged: dict[str, Any] = {}
    for path in values:
        for key, value in _image_block(path).items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = {**merged[key], **value}
            else:
                merged[key] = value
    return merged


def refs(values: list[Path]) -> dict[str, str]:
    """``{flavour: reference}`` for the chart's values overridden by ``values``."""
    image = _merged([CHART_VALUES, *values])
    registry = str(image.get("registry") or "").rstrip("/")
    out: dict[str, str] = {}
    for flavour in FLAVOURS:
        block = image.get(flavour)
        if not isinstance(block, dict) or not block.get("repository") or not block.get("tag"):
            raise RefsError(f"image.{flavour}.repository and image.{flavour}.tag must be set")
        repository, tag = str(block["repository"]), str(block["tag"])
        out[flavour] = f"{registry}/{repository}:{tag}" if registry else f"{repository}:{tag}"
    return out


def main(argv: list[str]) -> int:
    try:
        found = refs([Path(p) for p in argv])
    except RefsError as exc:
        print(f"packaging/image/refs.py: {exc}", file=sys.stderr)
        return 2
    for flavour, ref in found.items():
        print(flavour, ref)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
