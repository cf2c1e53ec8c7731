"""The plugin API: ``hooks`` exports what a plugin author needs and nothing else, ships
``py.typed``, and every hookspec documents only its own hook."""

from __future__ import annotations

import inspect
from pathlib import Path

import hooks
from hooks import spec

HOOKS_DIR = Path(hooks.__file__).parent
REPO = HOOKS_DIR.parent


def test_the_public_names_are_the_plugin_authors_kit() -> None:
    assert sorted(hooks.__all__) == sorted(
        ["hookimpl", "Plan", "PodFacts", "ContainerFacts", "NodeFacts", "Resources", "CPUTopology",
         # the sampled usage rhp_reconcile_usage receives
         "Usage", "UsageSample",
         # the cgroup directories a plan's writes name
         "CgroupInfo", "pod_cgroup_path", "container_cgroup_path", "kube_qos_cgroup_path", "host_app_cgroup_path"]
    )
    public = {name for name in vars(hooks) if not name.startswith("_")}
    # submodules are attributes of a package once imported; they are not part of ``__all__``
    assert public - set(hooks.__all__) <= {"facts", "plan", "spec", "manager", "plugins", "usage", "signatures"}


def test_py_typed_ships_with_the_package() -> None:
    assert (HOOKS_DIR / "py.typed").is_file()
    assert 'hooks = ["py.typed"]' in (REPO / "pyproject.toml").read_text()


def test_each_hookspec_has_a_short_docstring_about_its_own_hook() -> None:
    shared = ("policy", "Fail", "Ignore", "conflict", "worker thread", "skip-hookserver")
    for stage, hook_name in spec.STAGES.items():
        doc = inspect.getdoc(getattr(spec, hook_name)) or ""
        assert doc, hook_name
        assert len(doc.splitlines()) <= 12, f"{hook_name}: keep it short; shared rules go in the module docstring"
        assert not [w for w in shared if w in doc], f"{hook_name} repeats a rule shared by all hooks"
        for param in inspect.signature(getattr(spec, hook_name)).parameters:
            assert f":param {param}:" in doc, f"{hook_name} documents {param}"
        if spec.CRI_FIELDS[stage]:
            assert "May change:" in doc, f"{hook_name} says which CRI fields it may change"
    module_doc = spec.__doc__ or ""
    assert all(w in module_doc for w in ("Fail", "Ignore", "conflict", "skip-hookserver", "CRI_FIELDS"))
