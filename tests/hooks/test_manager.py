"""The plugin manager refuses pluggy's ordering and wrapping options at registration: the hook
runner calls each plugin's hook function once, in the config's order, so ``tryfirst``,
``trylast``, ``wrapper`` and ``hookwrapper`` would be accepted and then not honoured."""

from __future__ import annotations

import types
from collections.abc import Callable, Generator

import pluggy
import pytest

from hooks import ContainerFacts, Plan, PodFacts, hookimpl
from hooks.manager import REFUSED_OPTIONS, PluginManager, make_plugin_manager


def _plain(pod: PodFacts, container: ContainerFacts) -> Plan | None:
    return Plan().set_env("PLAIN", "1")


def _wrapper(pod: PodFacts, container: ContainerFacts) -> Generator[None, Plan | None, Plan | None]:
    result = yield
    return result


def _module(name: str, function: Callable[..., object], option: str | None = None) -> types.ModuleType:
    """A plugin module ``name`` with one ``rhp_pre_create_container``, marked with ``option``."""
    module = types.ModuleType(name)
    function = types.FunctionType(function.__code__, function.__globals__, "rhp_pre_create_container")
    marker = hookimpl(
        tryfirst=option == "tryfirst",
        trylast=option == "trylast",
        wrapper=option == "wrapper",
        hookwrapper=option == "hookwrapper",
    )
    setattr(module, "rhp_pre_create_container", marker(function))  # noqa: B010 (a new module's attribute)
    return module


@pytest.mark.parametrize(
    ("option", "function"),
    [
        ("tryfirst", _plain),
        ("trylast", _plain),
        ("wrapper", _wrapper),
        ("hookwrapper", _wrapper),
    ],
)
def test_an_ordering_or_wrapping_option_is_refused_naming_the_plugin_and_the_hook(
    option: str, function: Callable[..., object]
) -> None:
    plugin = _module(f"rhp_test_{option}", function, option)
    with pytest.raises(pluggy.PluginValidationError) as refused:
        make_plugin_manager(builtins=[], entry_points=False, extra=[plugin])
    message = str(refused.value)
    assert f"plugin 'rhp_test_{option}'" in message
    assert "hook 'rhp_pre_create_container'" in message
    assert f"{option}=True" in message
    assert refused.value.plugin is plugin


def test_the_refused_options_are_pluggys_ordering_and_wrapping_options() -> None:
    assert set(REFUSED_OPTIONS) == {"tryfirst", "trylast", "wrapper", "hookwrapper"}


def test_a_refused_plugin_leaves_the_manager_as_it_was() -> None:
    pm = make_plugin_manager(builtins=["cpuset"], entry_points=False)
    before = pm.list_name_plugin()
    with pytest.raises(pluggy.PluginValidationError):
        pm.register(_module("rhp_test_first", _plain, "tryfirst"), name="first")
    assert pm.list_name_plugin() == before
    assert not pm.has_plugin("first")
    assert all(impl.plugin_name != "first" for impl in pm.hook.rhp_pre_create_container.get_hookimpls())
    # the same manager still takes a plain plugin under that name
    assert pm.register(_module("rhp_test_plain", _plain), name="first") == "first"


def test_a_hook_named_by_specname_is_named_in_the_refusal() -> None:
    class Plugin:
        @hookimpl(specname="rhp_post_start_container", trylast=True)
        def started(self, pod: PodFacts) -> Plan | None:
            return None

    pm = make_plugin_manager(builtins=[], entry_points=False)
    with pytest.raises(pluggy.PluginValidationError, match="plugin 'late': hook 'rhp_post_start_container'"):
        pm.register(Plugin(), name="late")


def test_plain_and_optional_impls_still_register_and_run() -> None:
    plain = _module("rhp_test_plain", _plain)
    pm = make_plugin_manager(builtins=[], entry_points=False, extra=[plain])
    assert isinstance(pm, PluginManager)
    assert pm.has_plugin("rhp_test_plain")
    (impl,) = pm.hook.rhp_pre_create_container.get_hookimpls()
    assert impl.function(pod=None, container=None) == Plan().set_env("PLAIN", "1")


def test_the_built_in_plugins_ask_for_no_refused_option() -> None:
    pm = make_plugin_manager(entry_points=False)
    assert pm.get_plugins()
