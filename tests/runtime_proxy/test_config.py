"""The config file model (``runtime_proxy/config.py``): strict keys with paths and suggestions,
the size bound before parsing, what a command checks at start, and ``docs/config.md``'s table
kept equal to the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime_proxy import config
from runtime_proxy.config import ConfigError, ProxyConfig, check_usable, load_config, reference_table

REPO = Path(__file__).resolve().parents[2]
BEGIN = "<!-- begin generated: python -m runtime_proxy.config -->\n"
END = "<!-- end generated -->"


def test_docs_config_md_holds_the_generated_table() -> None:
    text = (REPO / "docs" / "config.md").read_text()
    table = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert table == reference_table(), (
        "docs/config.md differs from the config model: replace the table between the markers with "
        "the output of `python -m runtime_proxy.config`"
    )


def test_every_key_has_a_description() -> None:
    for model in (config.ProxyConfig, config.PluginConfig, config.UsageLoopConfig):
        missing = [name for name, info in model.model_fields.items() if not info.description]
        assert missing == [], f"{model.__name__} fields without a description: {missing}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("nodeConfigfile: /x\n", "nodeConfigfile: unknown key; did you mean nodeConfigFile?",
                     id="a misspelled top-level key names itself and the key meant"),
        pytest.param("pluginmodules: []\n", "pluginmodules: unknown key; did you mean pluginModules?",
                     id="a key in the wrong case suggests the right case"),
        pytest.param("plugins:\n  - name: cpuset\n    polcy: Fail\n",
                     "plugins.0.polcy: unknown key; did you mean policy?",
                     id="an unknown key inside a plugin entry names its path"),
        pytest.param("zzzzzz: 1\n", "zzzzzz: unknown key",
                     id="an unknown key with nothing close has no suggestion"),
        pytest.param("defaultPolicy: fail\n", "defaultPolicy: Input should be 'Fail' or 'Ignore'",
                     id="a wrong value names its key"),
        pytest.param("- a\n", "must be a mapping of settings, not list",
                     id="a document that is not a mapping is refused"),
    ],
)
def test_bad_keys_are_errors_with_their_path(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(str(path))
    assert str(err.value).startswith(f"{path}: ")
    assert expected in str(err.value)
    assert "pydantic" not in str(err.value)


def test_an_oversized_file_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"[" * (config.MAX_CONFIG_BYTES + 1))  # would be a parse bomb if parsed
    with pytest.raises(ConfigError, match="larger than"):
        load_config(str(path))


def test_the_packaged_config_loads() -> None:
    cfg = load_config(str(REPO / "packaging" / "proxy-config.yaml"))
    assert cfg.plugins is not None and cfg.plugins[0].name == "cpuset"


def test_a_missing_node_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nodeConfigFile .*: no such file"):
        check_usable(ProxyConfig(nodeConfigFile=str(tmp_path / "absent.yaml")))
    with pytest.raises(ConfigError, match="not a regular file"):
        check_usable(ProxyConfig(nodeConfigFile=str(tmp_path)))
    present = tmp_path / "node.yaml"
    present.write_text("{}\n")
    check_usable(ProxyConfig(nodeConfigFile=str(present)))


def test_from_cluster_without_the_kubernetes_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"py3-none-any\.whl\[cluster\]"):
        check_usable(ProxyConfig(fromCluster=True))
    check_usable(ProxyConfig(fromCluster=False))
