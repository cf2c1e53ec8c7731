"""``scheduler-ext remove-leases``: delete a release's Leases once its pods are gone.

Who calls this: the Helm chart's post-delete hook (``templates/lease-cleanup.yaml``), after
``helm uninstall`` deleted the release's objects. kube-scheduler's leader election, the manager's
elector and the extenders' per-node ledger each leave a Lease in the release namespace; they are
runtime state no template owns, so nothing else removes them (and deleting the namespace is no
answer in ``kube-system``).

It first waits (up to ``--timeout``) until no pod matches ``--wait-pods`` in the namespace (a
pod still stopping may write its Lease once more), then lists the namespace's Leases (paged,
``LIST_PAGE`` at a time, at most ``MAX_LEASES``) and deletes those named by ``--name`` or
starting with a ``--prefix``; a Lease already gone is no error. It prints the names it deleted as
one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from rhp_kube import credentials
from rhp_ops.cli import add_global_flags

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "add_parser", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
LIST_PAGE = 500
MAX_LEASES = 100_000

EXIT_CODES = """exit codes:
  0  the matching Leases are gone
  1  the API server refused a call, or pods still matched --wait-pods after --timeout
  2  bad flags, or a kubeconfig that cannot be loaded"""


def add_parser(sub: Any, *, level_help: str, fmt_help: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "remove-leases", help="delete a release's Leases once its pods are gone (Helm's post-delete hook)",
        description="Wait until no pod matches --wait-pods, then delete the Leases of --namespace named by --name "
                    "or starting with a --prefix.", epilog=EXIT_CODES)
    credentials.add_flags(p)
    p.add_argument("--namespace", required=True, help="the Leases' namespace")
    p.add_argument("--name", action="append", default=[], help="a Lease to delete (repeatable)")
    p.add_argument("--prefix", action="append", default=[], help="delete the Leases whose name starts so (repeatable)")
    p.add_argument("--wait-pods", default="", metavar="SELECTOR", help="first wait until no pod matches this "
                                                                        "label selector in the namespace")
    p.add_argument("--timeout", type=float, default=120.0, help="how long to wait for the pods (default %(default)s)")
    add_global_flags(p, subcommand=True, level_help=level_help, fmt_help=fmt_help)
    p.set_defaults(func=run)
    return p


def _fail(message: str, code: int) -> int:
    print(f"scheduler-ext remove-leases: {message}", file=sys.stderr)
    return code


def matches(name: str, names: list[str], prefixes: list[str]) -> bool:
    return name in names or any(p and name.startswith(p) for p in prefixes)


def run(args: argparse.Namespace) -> int:
    import kubernetes


    if not args.name and not any(args.prefix):
        return _fail("name at least one --name or --prefix", EXIT_USAGE)
    if args.timeout <= 0:
        return _fail("--timeout must be positive", EXIT_USAGE)
    try:
        api_client = credentials.from_args(args)
    except Exception as exc:  # the kubernetes config loaders raise their own types
        return _fail(f"cannot load the API server configuration: {exc}", EXIT_USAGE)
    core = kubernetes.client.CoreV1Api(api_client)
    coordination = kubernetes.client.CoordinationV1Api(api_client)
    ApiException = kubernetes.client.exceptions.ApiException
    try:
        if args.wait_pods:
            deadline = time.monotonic() + args.timeout
            while core.list_namespaced_pod(args.namespace, label_selector=args.wait_pods, limit=1).items:
                if time.monotonic() > deadline:
                    return _fail(f"pods matching {args.wait_pods!r} still exist after {args.timeout:g} s", EXIT_FAILED)
                time.sleep(1.0)
        names: list[str] = []
        token: str | None = None
        while len(names) < MAX_LEASES:
            page = coordination.list_namespaced_lease(args.namespace, limit=LIST_PAGE, _continue=token)
            for lease in page.items:
                name = lease.metadata.name if lease.metadata is not None else None
                if isinstance(name, str) and matches(name, args.name, args.prefix):
                    names.append(name)
            token = page.metadata._continue if page.metadata is not None else None
            if not token:
                break
        deleted = []
        for name in names:
            try:
                coordination.delete_namespaced_lease(name, args.namespace)
                deleted.append(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise
    except ApiException as exc:
        return _fail(f"the API server refused: {exc.status} {exc.reason}", EXIT_FAILED)
    except OSError as exc:
        return _fail(f"API server unreachable: {exc}", EXIT_FAILED)
    print(json.dumps({"namespace": args.namespace, "deleted": sorted(deleted)}))
    return EXIT_OK
