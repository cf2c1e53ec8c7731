"""The registration file of a hook server (Koordinator's format, ``runtime_proxy.hookclient``'s
"Registrations"): its shape, bounds and parser. Pure; read by the registry
(``runtime_proxy.hookclient.registry``) and ``doctor``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from hooks.spec import KOORD_HOOK_POINTS
from koord_formats.bounded import load_json
from koord_formats.errors import FormatError
from runtime_proxy.config import validation_message

__all__ = [
    "MAX_REGISTRATION_BYTES",
    "MAX_TIMEOUT",
    "Policy",
    "Registration",
    "RegistrationDocument",
    "RegistrationError",
    "parse_registration",
    "strip_unix",
]


Policy = Literal["Fail", "Ignore"]


MAX_REGISTRATION_BYTES = 64 << 10


MAX_TIMEOUT = 300.0


_POLICIES: dict[str, Policy] = {"Fail": "Fail", "Ignore": "Ignore", "None": "Ignore", "": "Ignore"}


class RegistrationError(ValueError):
    """A registration file that cannot be used; the message says why."""


@dataclass(frozen=True)
class Registration:
    """One hook server, as a registration file describes it."""

    name: str  # the file name, e.g. "koordlet.json"
    endpoint: str  # unix socket path, no scheme
    policy: Policy
    hooks: tuple[str, ...]  # Koordinator hook point names, in the file's order
    timeout: float
    ignored_hooks: tuple[str, ...] = ()


def strip_unix(endpoint: str) -> str:
    """``unix:///run/x.sock`` and ``/run/x.sock`` -> ``/run/x.sock``."""
    return endpoint[len("unix://"):] if endpoint.startswith("unix://") else endpoint


class RegistrationDocument(BaseModel):
    """A registration file's shape: Koordinator's three keys and our ``timeout-seconds``; any
    other key is an error naming it. Values are checked further by ``parse_registration``."""

    model_config = ConfigDict(extra="forbid")

    remote_endpoint: StrictStr = Field(alias="remote-endpoint")
    failure_policy: StrictStr | None = Field(default=None, alias="failure-policy")
    runtime_hooks: list[StrictStr] = Field(alias="runtime-hooks")
    timeout_seconds: StrictFloat | StrictInt | None = Field(default=None, alias="timeout-seconds")


def parse_registration(name: str, text: str | bytes, default_timeout: float) -> Registration:
    """Parse one registration file's content: bounded (``MAX_REGISTRATION_BYTES``) before the
    JSON load, then ``RegistrationDocument``'s shape, then the values. Raises
    ``RegistrationError`` when malformed."""
    if len(text) > MAX_REGISTRATION_BYTES:
        raise RegistrationError(f"larger than {MAX_REGISTRATION_BYTES} bytes")
    try:
        raw = text.decode("utf-8") if isinstance(text, bytes) else text
        data = load_json(raw, "registration", max_chars=MAX_REGISTRATION_BYTES)
    except UnicodeDecodeError as exc:
        raise RegistrationError(f"not UTF-8: {exc.reason} at byte {exc.start}") from exc
    except FormatError as exc:
        raise RegistrationError(str(exc).removeprefix("registration: ")) from exc
    if not isinstance(data, dict):
        raise RegistrationError("must be a JSON object")
    try:
        doc = RegistrationDocument.model_validate(data)
    except ValidationError as exc:
        raise RegistrationError(validation_message(exc, RegistrationDocument)) from exc
    raw_endpoint = doc.remote_endpoint
    if not raw_endpoint.strip():
        raise RegistrationError("remote-endpoint must be a non-empty string")
    endpoint = strip_unix(raw_endpoint.strip())
    if "://" in endpoint:
        raise RegistrationError(f"remote-endpoint {raw_endpoint!r}: only unix sockets are supported")
    if not endpoint.startswith("/") or "\x00" in endpoint:
        raise RegistrationError(f"remote-endpoint {raw_endpoint!r} must be an absolute socket path")
    raw_policy = doc.failure_policy or ""
    if raw_policy not in _POLICIES:
        raise RegistrationError(f"failure-policy {raw_policy!r} must be Fail, Ignore, None or empty")
    hooks: list[str] = []
    ignored: list[str] = []
    for hook in doc.runtime_hooks:
        if hook in KOORD_HOOK_POINTS:
            if hook not in hooks:
                hooks.append(hook)
        else:
            ignored.append(hook)
    timeout = default_timeout
    if doc.timeout_seconds is not None:
        if not 0 < doc.timeout_seconds <= MAX_TIMEOUT:
            raise RegistrationError(f"timeout-seconds must be in (0, {MAX_TIMEOUT:g}]")
        timeout = float(doc.timeout_seconds)
    return Registration(name, endpoint, _POLICIES[raw_policy], tuple(hooks), timeout, tuple(ignored))
