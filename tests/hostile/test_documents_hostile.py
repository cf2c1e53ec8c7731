"""Hostile YAML and JSON documents at every reader of the product (issue 34 item 5): each goes
through the one bounded, alias-refusing reader (``rhp_ops.yamlsafe``), so an alias bomb (the
"billion laughs" shape: nine levels of nine references, 9**9 leaves once walked), an anchor,
nesting thousands deep and a text over the reader's bound each get one clear error, at once.

Readers: the proxy's config file (``runtime_proxy.config.load_config``), the node config
document (``runtime_proxy.state.nodedoc.load_document``), kubelet's configuration as
``kubelet-switch`` reads it (``config_endpoint``) and as the node report reads it
(``runtime_proxy.report.sources.parse_kubelet_config``), ``scheduler-ext simulate``'s document
and the extender's ``--config`` file (``scheduler_ext.extconfig.parse_config_text``). Before,
four of them used ``yaml.safe_load``, which follows aliases and hands the bomb to the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rhp_ops.yamlsafe import DocumentError, load_document, load_yaml
from runtime_proxy import config as proxy_config
from runtime_proxy.commands import kubelet_switch
from runtime_proxy.report import sources
from runtime_proxy.state import nodedoc
from scheduler_ext import cli as extender_cli
from scheduler_ext import extconfig


def _bomb(top_key: str = "top") -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        refs = ", ".join([f"*l{i - 1}"] * 9)
        lines.append(f"l{i}: &l{i} [{refs}]")
    lines.append(f"{top_key}: *l8")
    return "\n".join(lines) + "\n"


BOMB = _bomb()
ANCHOR = "a: &x 1\nb: 2\n"
DEEP = "a:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(2000)) + " " * 2001 + "x: 1\n"
DEEP_FLOW = "a: " + "[" * 50000 + "]" * 50000 + "\n"


def _config(text: str, tmp_path: Path) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    try:
        proxy_config.load_config(str(path))
    except proxy_config.ConfigError as exc:
        return str(exc)
    return ""


def _nodedoc(text: str, tmp_path: Path) -> str:
    try:
        nodedoc.load_document(text)
    except ValueError as exc:
        return str(exc)
    return ""


def _kubelet_switch(text: str, tmp_path: Path) -> str:
    try:
        kubelet_switch.config_endpoint(text)
    except kubelet_switch.SwitchError as exc:
        return str(exc)
    return ""


def _kubelet_report(text: str, tmp_path: Path) -> str:
    try:
        sources.parse_kubelet_config(text)
    except ValueError as exc:
        return str(exc)
    return ""


def _simulate(text: str, tmp_path: Path) -> str:
    path = tmp_path / "doc.yaml"
    path.write_text(text)
    with pytest.raises((extender_cli._BadDocument, extender_cli._Unreadable)) as caught:
        extender_cli._read_doc(str(path))
    return str(caught.value)


def _extconfig(text: str, tmp_path: Path) -> str:
    try:
        extconfig.parse_config_text(text)
    except extconfig.ConfigError as exc:
        return str(exc)
    return ""


READERS: dict[str, Callable[[str, Path], str]] = {
    "proxy config": _config,
    "node config document": _nodedoc,
    "kubelet-switch": _kubelet_switch,
    "node report's kubelet config": _kubelet_report,
    "simulate": _simulate,
    "extender config": _extconfig,
}


@pytest.mark.parametrize("reader", READERS)
def test_an_alias_bomb_is_refused_as_aliases(reader: str, tmp_path: Path) -> None:
    error = READERS[reader](BOMB, tmp_path)
    assert "anchors are not allowed" in error, error
    assert "\n" not in error and len(error) < 600


@pytest.mark.parametrize("reader", READERS)
def test_an_anchor_alone_is_refused(reader: str, tmp_path: Path) -> None:
    assert "anchors are not allowed" in READERS[reader](ANCHOR, tmp_path)


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("text", [DEEP, DEEP_FLOW], ids=["block", "flow"])
def test_nesting_thousands_deep_is_refused(reader: str, text: str, tmp_path: Path) -> None:
    error = READERS[reader](text, tmp_path)
    assert any(w in error for w in ("nested", "larger than", "too large", "more than")), error


# Each reader's own bound, and a text just over it.
OVERSIZED = {
    "proxy config": proxy_config.MAX_CONFIG_BYTES,
    "node config document": nodedoc.MAX_NODE_CONFIG_BYTES,
    "kubelet-switch": kubelet_switch.MAX_FILE_BYTES,
    "node report's kubelet config": sources.MAX_KUBELET_CONFIG_BYTES,
    "simulate": extender_cli.MAX_SIMULATE_BYTES,
    "extender config": extconfig.MAX_CONFIG_BYTES,
}


@pytest.mark.parametrize("reader", READERS)
def test_a_document_over_its_bound_is_refused_before_parsing(reader: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    limit = OVERSIZED[reader]
    if reader == "simulate":  # 64 MiB: the same rule at a smaller bound
        monkeypatch.setattr(extender_cli, "MAX_SIMULATE_BYTES", 1 << 16)
        limit = 1 << 16
    text = "# " + "x" * limit + "\na: 1\n"
    error = READERS[reader](text, tmp_path)
    assert any(w in error for w in ("larger than", "too large", "more than")), error


def test_the_reader_itself() -> None:
    assert load_yaml("a: [1, {b: c}]\n", max_bytes=100) == {"a": [1, {"b": "c"}]}
    assert load_document('{"a": 1}', max_bytes=100) == {"a": 1}
    assert load_document("a: 1", max_bytes=100) == {"a": 1}
    for text, why in ((BOMB, "anchors are not allowed"), ("a: *x\n", "aliases are not allowed"),
                      (DEEP, "nested more than"), ("a: [\n", "not valid YAML (line"),
                      ("x" * 101, "larger than 100 bytes"), ("é" * 51, "larger than 100 bytes")):
        with pytest.raises(DocumentError, match=r"^[^\n]*$") as caught:
            load_yaml(text, max_bytes=len(BOMB) + len(DEEP) if len(text) > 101 else 100)
        assert why in str(caught.value), (text[:20], str(caught.value))
    with pytest.raises(DocumentError, match="nested too deeply"):
        load_document("[" * 100000, max_bytes=200000)
    with pytest.raises(DocumentError, match="nested more than 3 deep"):
        load_yaml("a: {b: {c: {d: 1}}}", max_bytes=100, max_depth=3)
