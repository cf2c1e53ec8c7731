"""The image references ``packaging/image/build.sh`` names the images it builds
(``packaging/image/refs.py``, from the chart's values), for the tests that check the chart and
the kustomize overlays run exactly those."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def refs_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rhp_image_refs", REPO / "packaging" / "image" / "refs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def image_refs(*values: Path) -> dict[str, str]:
    """``{"node": ref, "cluster": ref}`` for the chart's values with ``values`` files on top."""
    found: dict[str, str] = refs_module().refs(list(values))
    return found
