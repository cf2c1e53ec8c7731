"""The real-containerd development environment shared by tests, the demo and benchmarks.

- :mod:`~runtime_proxy.devenv.containerd`: :class:`PrivateContainerd`, a containerd 1.6, 1.7 or
  2.1 on private paths, started and torn down by PID;
- :mod:`~runtime_proxy.devenv.image`: the busybox OCI image, built offline and imported;
- :mod:`~runtime_proxy.devenv.cri`: :class:`CriClient` and CRI request builders (needs the
  generated :mod:`cri_protos` stubs, so it is imported on demand, not here);
- :mod:`~runtime_proxy.devenv.cgroupfs`: read container cgroup files, remove pod cgroup parents.

Nothing in the proxy itself imports this package; it needs root and a machine set up by
``scripts/install-deps.sh``.
"""

from runtime_proxy.devenv.cgroupfs import pod_cgroup_parent, read_cgroup_file, read_cgroup_int, remove_cgroup_tree
from runtime_proxy.devenv.containerd import (
    VERSIONS,
    ContainerdError,
    PrivateContainerd,
    available_versions,
)
from runtime_proxy.devenv.image import DEFAULT_IMAGE

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
