"""Real-containerd fixtures, parametrized over containerd 1.6, 1.7 and 2.1.

Every test that uses one of these runs once per containerd version (ids ``containerd-1.6``,
``containerd-1.7``, ``containerd-2.1``):

- ``containerd_env`` (session): a :class:`~rhp_devenv.env.ContainerdEnv`: a started
  private containerd with the busybox image imported, its ``socket``, ``version``, a CRI client
  factory ``cri_client(socket=None)`` and ``new_cgroup_parent(qos="burstable")``. A version whose
  binaries are missing is skipped with the reason (``RHP_REQUIRE_CONTAINERD=1.6,1.7,2.1`` turns
  that into a failure). Not root: skipped.
- ``containerd`` (function): the same object, with per-test cleanup: pods created during the test
  are stopped and removed, and the test's cgroup parents and CRI clients go away.
- ``cri`` (function): a :class:`~rhp_devenv.cri.CriClient` on the containerd socket.
- ``cri_client`` (function): the factory ``cri_client(socket=None, timeout=30.0)`` for any socket
  (a proxy in front of containerd, say).
- ``cgroup_parent`` (function): a fresh ``/rhptest-<random>-<v>/kubepods/burstable/pod<uid>``.

A test marked ``@pytest.mark.one_containerd`` (what it checks does not depend on the version)
runs on the first version only: its items for the other versions are deselected at collection,
not skipped.

Each session containerd owns a private top cgroup directory, so engineers and CI runs on one
machine never touch each other's cgroups.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator

import pytest
from rhp_devenv import VERSIONS
from rhp_devenv.containerd import binaries_for
from rhp_devenv.cri import CriClient
from rhp_devenv.env import ContainerdEnv

from tests.integration.harness import required_versions

_SESSION_TAG = secrets.token_hex(4)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the ``one_containerd`` tests on ``VERSIONS[0]`` only (see the module docstring)."""
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        version = callspec.params.get("containerd_env") if callspec is not None else None
        if item.get_closest_marker("one_containerd") and version not in (None, VERSIONS[0]):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session", params=VERSIONS, ids=[f"containerd-{v}" for v in VERSIONS])
def containerd_env(request: pytest.FixtureRequest) -> Iterator[ContainerdEnv]:
    """A private containerd of one version for the whole session (see the module docstring)."""
    version: str = request.param
    if os.geteuid() != 0:
        pytest.skip("needs root to run containerd")
    missing = binaries_for(version).missing()
    if missing:
        reason = (
            f"containerd {version} is not installed ({', '.join(map(str, missing))} missing); "
            "scripts/install-deps.sh installs it"
        )
        if version in required_versions():
            pytest.fail(reason)
        pytest.skip(reason)
    env = ContainerdEnv.start(version, tag=_SESSION_TAG)
    try:
        yield env
    finally:
        env.stop()


@pytest.fixture
def containerd(containerd_env: ContainerdEnv) -> Iterator[ContainerdEnv]:
    """The session containerd, with this test's pods, cgroup parents and clients cleaned up after it."""
    containerd_env.begin_round()
    try:
        yield containerd_env
    finally:
        containerd_env.end_round()


@pytest.fixture
def cri(containerd: ContainerdEnv) -> CriClient:
    """A CRI client on the containerd socket."""
    return containerd.cri_client()


@pytest.fixture
def cri_client(containerd: ContainerdEnv) -> Callable[..., CriClient]:
    """Factory: ``cri_client(socket=None, timeout=30.0)`` gives a CRI client on any socket."""
    return containerd.cri_client


@pytest.fixture
def cgroup_parent(containerd: ContainerdEnv) -> str:
    """A fresh burstable pod cgroup parent under this containerd's private top directory."""
    return containerd.new_cgroup_parent("burstable")
