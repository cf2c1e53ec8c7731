"""Credentials for the API server, loaded once per process.

Every component that talks to Kubernetes (the node agent's cluster watch, node reports and
evictions; the extender; the manager) gets its ``kubernetes.client.ApiClient`` here. The
official ``kubernetes`` client is used for configuration and authentication only: it reads the
kubeconfig (contexts, client certificates, exec and token plugins) or the pod's service account
(with the token re-read as the kubelet rotates it, through the client's ``refresh_api_key_hook``);
``rhp_kube.http`` builds every request from the ``ApiClient`` it gives.

Where the credentials come from, in this order:

- ``in_cluster=True`` (``--in-cluster``): the pod's service account;
- ``in_cluster=None`` (the node agent, which has no flag): the service account when
  ``KUBERNETES_SERVICE_HOST`` is set, else a kubeconfig;
- a kubeconfig: ``kubeconfig`` (``--kubeconfig``), else ``KUBECONFIG`` (``:``-separated), else
  ``~/.kube/config``, with ``context`` (``--context``) or the file's current context. Each file
  is read first through ``rhp_ops.files`` (a FIFO or a huge file is refused, never read).

``load`` keeps what it loaded by its arguments, so the parts of one process share one
``ApiClient`` (one connection pool, one token refresher). ``add_flags`` adds the documented
flags to a command; ``problem`` says in one line why they cannot work, before anything starts.

Imports ``kubernetes`` only when called: the base install (without the ``[cluster]`` or
``[scheduler]`` extra) imports this module.
"""

from __future__ import annotations

import argparse
import os
import threading
from typing import TYPE_CHECKING, Any

from rhp_ops.files import FileRefused, check_kubeconfig

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = ["add_flags", "from_args", "load", "plain", "problem"]

# Connections a client may keep open to the API server: the watches of one component, its
# writes and the node agent's reports together stay well below this.
POOL_SIZE = 32

_lock = threading.Lock()
_loaded: dict[tuple[str | None, str | None, bool | None], Any] = {}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """``--kubeconfig``, ``--context`` and ``--in-cluster`` (docs/cli.md)."""
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                        help="kubeconfig file (default $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", default=None, help="kubeconfig context (default: its current context)")
    parser.add_argument("--in-cluster", action="store_true", help="use the pod's service account")


def _in_cluster(in_cluster: bool | None) -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) if in_cluster is None else in_cluster


def problem(kubeconfig: str | None = None, in_cluster: bool | None = False) -> str:
    """Why the kubeconfig files cannot be read (a FIFO, a huge file, ...), in one line; "" when
    they can, or when the service account is used. A missing file is left to ``load``."""
    if _in_cluster(in_cluster):
        return ""
    try:
        check_kubeconfig(kubeconfig)
    except FileRefused as exc:
        if exc.reason != "missing":
            return exc.message
    return ""


def load(kubeconfig: str | None = None, context: str | None = None, in_cluster: bool | None = None) -> ApiClient:
    """The process's ``ApiClient`` for these credentials, loaded on the first call.

    Raises ``FileRefused`` for a kubeconfig that must not be read, and whatever the kubernetes
    config loaders raise (``ConfigException``, ``OSError``) when the credentials are missing or
    unusable; a failed load is tried again by the next call."""
    key = (kubeconfig or os.environ.get("KUBECONFIG") or None, context or None, _in_cluster(in_cluster))
    with _lock:
        found: ApiClient | None = _loaded.get(key)
        if found is not None:
            return found
        from kubernetes import client, config

        loaders: Any = config  # Any: kubernetes.config's loaders have no annotations
        cfg = client.Configuration()
        if _in_cluster(in_cluster):
            loaders.load_incluster_config(client_configuration=cfg)
        else:
            check_kubeconfig(kubeconfig)  # refused before the loader reads the files by path
            loaders.load_kube_config(config_file=kubeconfig or os.environ.get("KUBECONFIG") or None,
                                     context=context, client_configuration=cfg)
        cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, POOL_SIZE)
        api: ApiClient = client.ApiClient(cfg)
        _loaded[key] = api
        return api


def from_args(args: argparse.Namespace) -> ApiClient:
    """``load`` with the flags ``add_flags`` added."""
    return load(args.kubeconfig, args.context, bool(args.in_cluster))


def plain(url: str) -> ApiClient:
    """An ``ApiClient`` for an API server at ``url`` without credentials (tests, the extender's
    ``--api-server``)."""
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = url
    cfg.connection_pool_maxsize = POOL_SIZE
    return client.ApiClient(cfg)


def forget() -> None:
    """Drop what ``load`` kept (tests)."""
    with _lock:
        _loaded.clear()
