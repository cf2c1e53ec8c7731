"""The real-containerd development environment shared by tests, the demo and benchmarks.

- :mod:`~rhp_devenv.containerd`: :class:`PrivateContainerd`, a containerd 1.6, 1.7 or
  2.1 on private paths, started and torn down by PID;
- :mod:`~rhp_devenv.image`: the busybox OCI image, built offline and imported;
- :mod:`~rhp_devenv.cri`: :class:`CriClient` and CRI request builders (needs the
  generated :mod:`cri_protos` stubs, so it is imported on demand, not here);
- :mod:`~rhp_devenv.cgroupfs`: read container cgroup files, remove pod cgroup parents;
- :mod:`~rhp_devenv.netns`: :class:`~rhp_devenv.netns.PrivateNetns`, a network namespace with
  only loopback, to run a containerd (and its pods' network) and its clients where no packet can
  leave the machine.

``devenv/critest/`` is not Python: it pins cri-tools' critest, built by
``scripts/build-critest.sh``.

Nothing in the proxy itself imports this package; it needs root and a machine set up by
``scripts/install-deps.sh``.
"""

from rhp_devenv.cgroupfs import pod_cgroup_parent, read_cgroup_file, read_cgroup_int, remove_cgroup_tree
from rhp_devenv.containerd import (
    VERSIONS,
    ContainerdError,
    PrivateContainerd,
    available_versions,
)
from rhp_devenv.image import DEFAULT_IMAGE

__all__ = [
    "DEFAULT_IMAGE",
    "VERSIONS",
    "ContainerdError",
    "PrivateContainerd",
    "available_versions",
    "pod_cgroup_parent",
    "read_cgroup_file",
    "read_cgroup_int",
    "remove_cgroup_tree",
]
