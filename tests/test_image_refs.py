"""Image coordinates are set in one place (issue 36, item 4): the image block of the chart's values,
or of the values file a user installs with. ``packaging/image/build.sh`` names the images it builds
from it (``packaging/image/refs.py``, with ``RHP_IMAGE_VALUES`` on top), and the chart renders the
same references from the same file; the defaults are what the build makes here (``localhost/``,
imported into containerd), so ``helm install`` with the defaults runs the images just built. On
the old main the build named ``localhost/...`` and the chart ran ``registry.example.com/...``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.image_refs import REPO, image_refs, refs_module
from tests.test_helm import FULL, containers, one

MINE = {"image": {"registry": "registry.corp.test:5000/platform", "node": {"tag": "0.1.0-corp.3"}}}


def test_the_defaults_are_what_the_build_makes_here() -> None:
    assert image_refs() == {"node": "localhost/runtime-hook-proxy-node:0.1.0",
                            "cluster": "localhost/runtime-hook-proxy-cluster:0.1.0"}


def test_a_values_file_of_one_s_own_names_both(tmp_path: Path) -> None:
    values = tmp_path / "mine.yaml"
    values.write_text(yaml.safe_dump(MINE))
    assert image_refs(values) == {"node": "registry.corp.test:5000/platform/runtime-hook-proxy-node:0.1.0-corp.3",
                                  "cluster": "registry.corp.test:5000/platform/runtime-hook-proxy-cluster:0.1.0"}


def _chart_images(values: dict[str, Any] | None) -> dict[str, str]:
    return {"node": containers(one(values, "DaemonSet", f"{FULL}-node"))["node-agent"]["image"],
            "cluster": containers(one(values, "Deployment", f"{FULL}-scheduler"))["scheduler-ext"]["image"]}


@pytest.mark.parametrize("values", [None, MINE, {"image": {"registry": ""}}],
                         ids=["the defaults", "a registry and a tag of one's own", "no registry"])
def test_the_chart_runs_what_the_build_names(values: dict[str, Any] | None, tmp_path: Path) -> None:
    files = []
    if values is not None:
        files.append(tmp_path / "values.yaml")
        files[0].write_text(yaml.safe_dump(values))
    assert _chart_images(values) == image_refs(*files)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param("- a list\n", "not a mapping of values", id="a list"),
        pytest.param("image: [1, 2]\n", "image is not a mapping", id="an image list"),
        pytest.param("image: {node: {repository: ''}}\n", "must be set", id="an empty repository"),
        pytest.param("image: {node: {tag: null}}\n", "must be set", id="no tag"),
        pytest.param("a: [\n", "not YAML", id="broken YAML"),
        pytest.param("x: " + "y" * (1 << 20) + "\n", "larger than", id="over the size bound"),
    ],
)
def test_a_values_file_that_cannot_name_the_images_is_refused(text: str, error: str, tmp_path: Path) -> None:
    values = tmp_path / "bad.yaml"
    values.write_text(text)
    module = refs_module()
    with pytest.raises(module.RefsError, match=error):
        module.refs([values])
    assert module.main([str(values)]) == 2


def test_the_image_build_names_its_images_from_the_values() -> None:
    build = (REPO / "packaging/image/build.sh").read_text()
    assert '"$here/refs.py" ${RHP_IMAGE_VALUES:+"$RHP_IMAGE_VALUES"}' in build
    assert "ref=${ref_of[$flavour]}" in build
    assert "localhost/runtime-hook-proxy-$flavour" not in build  # no second place
