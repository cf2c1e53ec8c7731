"""Koordinator's keys live in ``koord_formats`` only: no label key, annotation key, resource
name, NodeSLO field name or annotation JSON field name appears as a string literal in the
shipped packages that use them (docstrings, comments and tests aside).

What counts as such a literal, all read from ``koord_formats`` itself so the list never drifts:

- every constant of ``koord_formats.keys`` that holds a ``/`` (labels, annotations, resources);
- every PascalCase value of ``koord_formats.keys`` (alone or in a tuple or mapping there): the
  policy and strategy names such as ``FullPCPUs``, ``PCPULevel``, ``SingleNUMANode``,
  ``MostAllocated``, and the other enumerations spelled so;
- every camelCase NodeSLO field name of ``koord_formats.keys.SLO``;
- every camelCase string literal in ``koord_formats``'s parsers (the JSON field names of the
  annotation formats, such as ``numaNodeResources`` or ``cpusetExclusive``);

minus ``OUR_OWN``, names our own config uses for something else, and minus
``KUBERNETES_FIELDS``, field names of Kubernetes' own objects that the Reservation parser reads
too (every object has them; they are not Koordinator's). ``KUBERNETES_VALUES`` are Kubernetes'
own values spelled like a Koordinator one (the pod QoS class ``BestEffort`` is also a NUMA
policy name): allowed where the node agent or the manager means Kubernetes' value, never in the
extender.
"""

from __future__ import annotations

import ast
from pathlib import Path

from koord_formats import keys

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("runtime_proxy", "hooks", "scheduler_ext")
PARSER_MODULES = (
    "pod.py", "node.py", "topology.py", "nodeslo.py", "reservation.py", "nodemetric.py", "nrt.py",
    "colocation.py", "sloconfig.py", "selector.py", "profile.py", "cpunormalization.py",
)

# Names Koordinator uses that our own config also uses with another meaning (the proxy's
# ``cgroupRoot`` setting is a directory, NodeSLO's is a QoS section).
OUR_OWN = frozenset({"cgroupRoot"})
# Kubernetes' own field names (core and meta v1) that ``koord_formats/reservation.py`` reads.
KUBERNETES_FIELDS = frozenset({"apiVersion", "nodeName"})
# Pod fields (spec.schedulerName, spec.priorityClassName, status.qosClass) that a
# ClusterColocationProfile (``koord_formats/profile.py``) names the same way.
KUBERNETES_FIELDS |= {"schedulerName", "priorityClassName", "qosClass"}
# The list query parameter of the Kubernetes API (scheduler_ext/cleanup.py lists pods by it),
# spelled like a Reservation owner's ``labelSelector`` (a ``metav1.LabelSelector`` field).
KUBERNETES_FIELDS |= {"labelSelector"}
# Kubernetes' pod QoS classes that Koordinator also uses as a policy name; ``hooks``,
# ``runtime_proxy`` and the manager speak of the QoS class, the extender only of the policy.
KUBERNETES_VALUES = frozenset({"BestEffort"})
KUBERNETES_VALUES_ALLOWED_IN = ("runtime_proxy/", "hooks/", "colocation_manager/")

# Files allowed to spell out a Koordinator key: none, every scanned file imports them from
# koord_formats. The list may only shrink; a file added here needs a reason next to it.
ALLOWLIST: frozenset[str] = frozenset()


def _is_camel(text: str) -> bool:
    return text.isascii() and text.isidentifier() and text[:1].islower() and any(c.isupper() for c in text)


def _is_pascal(text: str) -> bool:
    """Two capitals or more with a lowercase letter: ``FullPCPUs``, ``BECPUEvict``; never a
    single word (``None``, ``Default``, ``Pending`` are common English) nor an acronym (``LSE``)."""
    return (
        text.isascii()
        and text.isidentifier()
        and text[:1].isupper()
        and any(c.islower() for c in text)
        and sum(c.isupper() for c in text) >= 2
    )


def _key_values() -> set[str]:
    """Every string value of ``koord_formats.keys``, those inside its tuples and mappings too."""
    out: set[str] = set()
    for name, value in vars(keys).items():
        if name.startswith("_"):
            continue
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        items = items if isinstance(items, list | tuple) else [items]
        out |= {v for v in items if isinstance(v, str)}
    return out


def _docstring_nodes(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    docs = _docstring_nodes(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def koordinator_literals() -> frozenset[str]:
    found = {v for v in vars(keys).values() if isinstance(v, str) and "/" in v}
    found |= {v for k, v in vars(keys.SLO).items() if not k.startswith("_") and isinstance(v, str) and _is_camel(v)}
    found |= {v for v in _key_values() if _is_pascal(v)}
    for name in PARSER_MODULES:
        found |= {text for _, text in _literals(REPO / "koord_formats" / name) if _is_camel(text)}
    return frozenset(found - OUR_OWN - KUBERNETES_FIELDS)


def test_the_literal_set_covers_each_kind() -> None:
    found = koordinator_literals()
    assert keys.ANNOTATION_RESOURCE_STATUS in found
    assert keys.LABEL_QOS_CLASS in found
    assert keys.RESOURCE_BATCH_CPU in found
    assert keys.SLO.CPU_SUPPRESS_THRESHOLD_PERCENT in found
    assert "cpusetExclusive" in found and "numaNodeResources" in found
    assert {keys.BIND_POLICY_FULL_PCPUS, keys.BIND_POLICY_SPREAD_BY_PCPUS, keys.EXCLUSIVE_POLICY_PCPU_LEVEL,
            keys.EXCLUSIVE_POLICY_NUMA_NODE_LEVEL, keys.MOST_ALLOCATED, keys.LEAST_ALLOCATED,
            keys.NUMA_POLICY_SINGLE_NUMA_NODE, keys.NODE_CPU_BIND_POLICY_FULL_PCPUS_ONLY} <= found
    assert not {"None", "Default", "Restricted", keys.QOS_LSE} & found  # single words and acronyms


def test_pascal_case_is_two_capitals_with_a_lowercase_letter() -> None:
    assert [_is_pascal(t) for t in ("FullPCPUs", "BECPUEvict", "MostAllocated", "None", "LSE", "cpuQOS")] == [
        True, True, True, False, False, False
    ]


def test_no_koordinator_literal_outside_koord_formats() -> None:
    wanted = koordinator_literals()
    found: list[str] = []
    for package in SCANNED:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel in ALLOWLIST:
                continue
            allowed = KUBERNETES_VALUES if rel.startswith(KUBERNETES_VALUES_ALLOWED_IN) else frozenset()
            found += [
                f"{rel}:{line}: {text!r}" for line, text in _literals(path) if text in wanted and text not in allowed
            ]
    assert found == [], "Koordinator keys belong in koord_formats:\n" + "\n".join(found)


def test_allowlisted_files_still_need_their_entry() -> None:
    """An allowlisted file that no longer holds a literal must leave the allowlist."""
    wanted = koordinator_literals()
    stale = [
        rel
        for rel in sorted(ALLOWLIST)
        if not (REPO / rel).exists() or not any(text in wanted for _, text in _literals(REPO / rel))
    ]
    assert stale == []
