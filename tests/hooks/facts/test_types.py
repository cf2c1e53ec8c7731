"""``hooks.facts``: the typed keyword arguments of the facts' ``replace`` methods stay the
dataclasses' fields, and one resource rule decodes every field."""

from __future__ import annotations

from dataclasses import fields

import pytest

from hooks.facts import (
    ContainerChanges,
    ContainerFacts,
    NodeChanges,
    NodeFacts,
    PodChanges,
    PodFacts,
    Resources,
    resource_value,
)


@pytest.mark.parametrize(
    ("facts", "changes"),
    [
        pytest.param(PodFacts, PodChanges, id="PodFacts.replace takes every PodFacts field"),
        pytest.param(ContainerFacts, ContainerChanges, id="ContainerFacts.replace takes every ContainerFacts field"),
        pytest.param(NodeFacts, NodeChanges, id="NodeFacts.replace takes every NodeFacts field"),
    ],
)
def test_replace_arguments_are_the_fields(facts: type, changes: type) -> None:
    assert set(changes.__annotations__) == {f.name for f in fields(facts)}


def test_every_resource_field_has_one_rule() -> None:
    assert Resources.from_dict({"hugepage_limits": [("2MB", 4)], "unified": {"a": 1}}) == Resources(
        hugepage_limits=(("2MB", 4),), unified={"a": "1"})
    for name in Resources.field_names():
        assert resource_value(name, getattr(Resources(), name)) == getattr(Resources(), name)
    with pytest.raises(ValueError, match="unknown resource fields"):
        resource_value("cpu", 1)
