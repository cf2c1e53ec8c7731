"""Hostile documents against the three strict input models: the config file
(``runtime_proxy/config.py``), the planner document (``runtime_proxy/engine/planner.py``) and
hook-server registrations (``runtime_proxy/hookclient/``). Each is bounded before it is
parsed and checked by its pydantic model after; every attack gives one short error naming a key
or a bound, never a traceback, a message that echoes the attack, or a value that slips through."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from runtime_proxy.commands import plan as planner
from runtime_proxy.config import load_config
from runtime_proxy.hookclient.registration import (
    MAX_REGISTRATION_BYTES,
    RegistrationError,
    parse_registration,
)

GOOD_REGISTRATION = {"remote-endpoint": "/run/x.sock", "failure-policy": "Ignore",
                     "runtime-hooks": ["PreCreateContainer"]}
LONG = "k" * 100_000
MAX_MESSAGE = 2000


def _reg(**extra: object) -> str:
    return json.dumps({**GOOD_REGISTRATION, **extra})


@pytest.mark.parametrize(
    ("text", "word"),
    [
        pytest.param(_reg(**{f"x{i}": 1 for i in range(2000)}), "and 1995 more",
                     id="a registration with two thousand unknown keys names five of them"),
        pytest.param(_reg(**{LONG[:60_000]: 1}), "unknown key", id="a registration key of sixty thousand characters"),
        pytest.param(_reg(**{"runtime-hooks": [["PreCreateContainer"]] * 10}), "runtime-hooks.0: must be a string",
                     id="hook names that are lists"),
        pytest.param(_reg(**{"remote-endpoint": {"$ref": "/run/x.sock"}}), "remote-endpoint: must be a string",
                     id="an endpoint that is an object"),
        pytest.param(_reg(**{"timeout-seconds": 1e308}), "timeout-seconds", id="a timeout of 1e308 seconds"),
        pytest.param(_reg(**{"failure-policy": True}), "failure-policy: must be a string", id="a boolean policy"),
        pytest.param(_reg(pad="x" * MAX_REGISTRATION_BYTES), "larger than", id="a registration past its bound"),
        pytest.param('{"a":' * 100 + "1" + "}" * 100, "nested", id="a registration nested a hundred deep"),
    ],
)
def test_hostile_registrations_are_refused_with_a_short_reason(text: str, word: str) -> None:
    with pytest.raises(RegistrationError) as err:
        parse_registration("x.json", text, 2.0)
    assert word in str(err.value) and len(str(err.value)) < MAX_MESSAGE and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "word"),
    [
        pytest.param("\n".join(f"k{i}: 1" for i in range(5000)), "and 4995 more",
                     id="a config with five thousand unknown keys names five of them"),
        pytest.param(f"{LONG}: 1\n", "not valid YAML", id="a config key of a hundred thousand characters"),
        pytest.param(f"plugins:\n  - name: {LONG}\n", "is configured but not installed",
                     id="a plugin name of a hundred thousand characters"),
        pytest.param("a: &a [1, 2]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nplugins: [*c, *c]\n",
                     "anchors are not allowed", id="YAML aliases fanning out into the plugin list"),
        pytest.param("plugins:\n  - name: cpuset\n    timeout: .inf\n", "timeout",
                     id="an infinite plugin timeout"),
        pytest.param("defaultTimeout: !!python/object/apply:os.system ['true']\n", "not valid YAML",
                     id="a YAML tag that would run code"),
        pytest.param("pluginModules: " + "[" * 3000 + "]" * 3000 + "\n", "nested",
                     id="a config nested three thousand deep"),
    ],
)
def test_hostile_configs_are_refused_with_a_short_reason(tmp_path: Path, text: str, word: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:  # ConfigError, or the plugin check of a valid config
        load_config(str(path)).plugin_settings(["cpuset"])
    message = str(err.value)
    assert word in message and len(message) < MAX_MESSAGE and "\n" not in message, message


@pytest.mark.parametrize(
    ("document", "word"),
    [
        pytest.param({"stage": "PreCreateContainer", "pod": {"labels": {str(i): i for i in range(20_000)}}},
                     "and 19995 more", id="twenty thousand labels of the wrong type"),
        pytest.param({"stage": "PreCreateContainer", "node": {"cgroup": {"version": 1e300}}},
                     "node.cgroup.version: must be an integer", id="a cgroup version of 1e300"),
        pytest.param({"stage": "PreCreateContainer", "plugins": [LONG]}, "unknown plugins", id="a plugin name of 100k"),
        pytest.param({"stage": "PreCreateContainer", "pod": {"containers": [{"nme": "x"}] * 1000}},
                     "pod.containers.0.nme: unknown key; did you mean name?",
                     id="a thousand containers with a misspelled key"),
    ],
)
def test_hostile_plan_documents_are_refused_with_a_short_reason(
    document: dict[str, object], word: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(document)))
    assert planner.main(["--no-entry-points"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert word in err and len(err) < MAX_MESSAGE, err[:300]
