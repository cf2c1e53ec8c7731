"""The extender's config file (``scheduler-ext serve --config FILE``): a JSON or YAML object
whose sections turn on what is off by default. The one section so far is ``loadAware``:
koord-scheduler's ``LoadAwareSchedulingArgs`` (parsed by ``koord_formats.loadaware``); without
it load-aware scheduling is off and NodeMetrics are not watched.

The file is read once at start by the one reader of configured files (``rhp_ops.files``:
regular files only, at most ``MAX_CONFIG_BYTES``); YAML anchors and aliases are refused (no
document expands past its size), and an unknown section is refused (a misspelt one would leave
a feature silently off). Every problem is one ``ConfigError`` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from koord_formats.errors import FormatError
from koord_formats.loadaware import LoadAwareArgs, parse_load_aware_args
from rhp_ops.files import FileRefused, read_text_file
from rhp_ops.yamlsafe import DocumentError, load_document

__all__ = ["MAX_CONFIG_BYTES", "ConfigError", "ExtenderFileConfig", "parse_config_text", "read_config_file"]

MAX_CONFIG_BYTES = 64 * 1024
SECTIONS = ("loadAware",)


class ConfigError(ValueError):
    """The config file cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class ExtenderFileConfig:
    """What the config file turns on (None: off)."""

    load_aware: LoadAwareArgs | None = None


def parse_config_text(text: str) -> ExtenderFileConfig:
    """The config document's text as ``ExtenderFileConfig``; ``ConfigError`` when it is not a
    JSON or YAML object of known sections, each valid."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"more than {MAX_CONFIG_BYTES} characters")
    try:  # the one reader of documents: JSON, else YAML without anchors or aliases
        doc = load_document(text, max_bytes=4 * MAX_CONFIG_BYTES)
    except DocumentError as exc:
        reason = str(exc)
        raise ConfigError(f"neither JSON nor YAML: {reason}"[:330] if reason.startswith("not valid YAML")
                          else reason) from None
    if doc is None:
        return ExtenderFileConfig()
    if not isinstance(doc, dict):
        raise ConfigError("the document must be an object of sections (loadAware)")
    unknown = sorted(str(k)[:64] for k in doc if k not in SECTIONS)
    if unknown:
        raise ConfigError(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    load_aware = None
    if doc.get("loadAware") is not None:
        try:
            load_aware = parse_load_aware_args(doc["loadAware"])
        except FormatError as exc:
            raise ConfigError(str(exc)) from None
    return ExtenderFileConfig(load_aware=load_aware)


def read_config_file(path: str) -> ExtenderFileConfig:
    """Read and parse the config file at ``path``; ``ConfigError`` for any problem."""
    try:
        text = read_text_file(path, limit=MAX_CONFIG_BYTES)
    except FileRefused as exc:
        raise ConfigError(f"cannot read {path}: {exc.message}") from None
    try:
        return parse_config_text(text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
