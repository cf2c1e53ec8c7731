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

Calls go through ``rhp_kube.http`` (``BlockingKubeHTTP``: the one transport, on an event loop of
this command's own; the official client only loads the configuration), each answer bounded
before it is parsed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from rhp_kube import credentials
from rhp_kube.errors import APIError, NotFoundError, TooLargeError
from rhp_ops.cli import add_global_flags

if TYPE_CHECKING:
    from rhp_kube.http import BlockingKubeHTTP

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "add_parser", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
LIST_PAGE = 500
MAX_LEASES = 100_000
_POD_PAGE_MAX = 4 << 20  # one pod (at most about 1.5 MiB), or a deleted Lease's last state
_REQUEST_TIMEOUT = 30.0  # seconds per call (a page of 500 Leases included)

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


def _items(page: dict[str, Any]) -> list[dict[str, Any]]:
    items = page.get("items")
    return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _names(page: dict[str, Any]) -> list[str]:
    out = []
    for item in _items(page):
        meta = item.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        if isinstance(name, str):
            out.append(name)
    return out


def _continue(page: dict[str, Any]) -> str:
    meta = page.get("metadata")
    token = meta.get("continue") if isinstance(meta, dict) else None
    return token if isinstance(token, str) else ""


def _remove(http: BlockingKubeHTTP, args: argparse.Namespace) -> int:
    from rhp_kube.http import json_object, lease_path, seg

    pods = f"/api/v1/namespaces/{seg(args.namespace)}/pods"
    if args.wait_pods:
        deadline = time.monotonic() + args.timeout
        while _items(json_object(http.request("GET", pods, params={"labelSelector": args.wait_pods, "limit": "1"},
                                              max_bytes=_POD_PAGE_MAX))):  # fmt: skip
            if time.monotonic() > deadline:
                return _fail(f"pods matching {args.wait_pods!r} still exist after {args.timeout:g} s", EXIT_FAILED)
            time.sleep(1.0)
    names: list[str] = []
    token = ""
    while len(names) < MAX_LEASES:
        params = {"limit": str(LIST_PAGE), **({"continue": token} if token else {})}
        page = json_object(http.request("GET", lease_path(args.namespace), params=params))
        names += [name for name in _names(page) if matches(name, args.name, args.prefix)]
        token = _continue(page)
        if not token:
            break
    deleted = []
    for name in names:
        try:
            http.request("DELETE", lease_path(args.namespace, name), max_bytes=_POD_PAGE_MAX)
            deleted.append(name)
        except NotFoundError:
            pass
    print(json.dumps({"namespace": args.namespace, "deleted": sorted(deleted)}))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if not args.name and not any(args.prefix):
        return _fail("name at least one --name or --prefix", EXIT_USAGE)
    if args.timeout <= 0:
        return _fail("--timeout must be positive", EXIT_USAGE)
    try:
        api_client = credentials.from_args(args)
    except Exception as exc:  # the kubernetes config loaders raise their own types
        return _fail(f"cannot load the API server configuration: {exc}", EXIT_USAGE)
    from rhp_kube.http import BlockingKubeHTTP  # aiohttp: the [scheduler] extra, as the credentials

    http = BlockingKubeHTTP(api_client, timeout=_REQUEST_TIMEOUT)
    try:
        return _remove(http, args)
    except TooLargeError as exc:
        return _fail(f"the API server's answer is too large: {exc}", EXIT_FAILED)
    except APIError as exc:
        return _fail(f"the API server refused: {exc}" if exc.status else str(exc), EXIT_FAILED)
    except ValueError as exc:  # an answer that is not JSON
        return _fail(f"the API server's answer does not decode: {str(exc)[:200]}", EXIT_FAILED)
    finally:
        http.close()
