"""An in-process fake Kubernetes API server for tests and benchmarks (loopback only).

It speaks the real REST paths and semantics that client libraries depend on, so the official
``kubernetes`` client (or kubectl-like tools) can talk to it unmodified:

- Paths: ``/api/v1/...`` and ``/apis/{group}/{version}/...``, cluster-scoped
  (``/{plural}/{name}``) and namespaced (``/namespaces/{ns}/{plural}/{name}``) resources,
  all-namespaces lists, subresources ``status`` and ``pods/{name}/binding``; discovery at
  ``/api``, ``/apis``, ``/version``.
- One global ``resourceVersion`` counter. Lists carry ``metadata.resourceVersion`` and support
  ``limit``/``continue`` pagination, ``labelSelector`` (``k=v``, ``k!=v``, ``k``, ``!k``) and
  ``fieldSelector`` (``metadata.name``, ``metadata.namespace``, ``spec.nodeName``, ``=``/``!=``).
- ``?watch=true``: a chunked stream of JSON events, one per line. Without a resourceVersion
  (or "0") the current objects come first as ADDED. A version older than the retained history
  gets an ERROR event with code 410. ``timeoutSeconds`` ends the stream (with a BOOKMARK when
  ``allowWatchBookmarks`` is set).
- POST creates (409 AlreadyExists, ``generateName``), PUT replaces, PATCH accepts
  ``application/merge-patch+json``, ``application/strategic-merge-patch+json`` (maps merged,
  lists with a known merge key merged by it, ``$patch: replace|delete`` honoured, other lists
  replaced) and ``application/json-patch+json`` (add, remove, replace, test). A
  ``metadata.resourceVersion`` in a PUT body or a patch is a precondition: 409 Conflict if stale.
- ``POST .../pods/{name}/binding`` sets ``spec.nodeName`` and the PodScheduled condition and
  merges the Binding's ``metadata.annotations`` into the pod in the same write (as
  kube-apiserver's BindingREST: set, never removed); 409 if the pod is already bound or the
  Binding's ``metadata.uid`` or ``metadata.resourceVersion`` (preconditions) does not match.
- ``freeze_watches(plural)``: the watch streams of that resource open now go silent for good
  and never end, as a half-open connection looks to the client (streams opened later work).
- ``POST .../pods/{name}/eviction`` (a policy/v1 ``Eviction``) as kube-apiserver's
  EvictionREST: 404 when the pod is gone; 409 when ``deleteOptions.preconditions.uid`` names
  another pod; for a running pod, the PodDisruptionBudgets of its namespace whose selector
  matches its labels decide: none, or one with ``status.disruptionsAllowed`` above 0 (then
  decremented), lets it go (201, the pod deleted); 0 gives 429 TooManyRequests with the
  ``DisruptionBudget`` cause; more than one gives 500. Pods that are Pending, terminal
  (Succeeded, Failed) or already being deleted are deleted without a budget check, as
  kube-apiserver does (``tests/e2e/test_e2e_nodeslo.py`` compares the two).
- ``DELETE`` of a named object honours ``preconditions.uid`` in its DeleteOptions body (409
  Conflict when the object has another uid), as kube-apiserver does.
- Watches wake only for events of their own resource; stored objects are never mutated in
  place, so successive versions share unchanged parts (cheap writes on the benchmark path).
- Errors are ``Status`` objects with the real ``reason`` values.

Known resources: nodes, pods, namespaces, configmaps, events, leases, PodDisruptionBudgets
(``policy/v1``), NodeResourceTopology (``topology.node.k8s.io/v1alpha1``), Device
(``scheduling.koordinator.sh/v1alpha1``), NodeSLO (``slo.koordinator.sh/v1alpha1``); add more
with ``register``. Test helpers: ``create``/``get``/``objects`` without HTTP, ``inject`` to fail
the next matching requests, ``count`` of requests by verb, ``evictions`` (every Eviction POST
with its answer's code, in order).

Run standalone (benchmarks): ``python -m tests.fakeapi --port 0 [--load objects.json]`` prints
the URL.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeAPIServer", "Resource"]

JSON = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


DEFAULT_RESOURCES = (
    Resource("", "v1", "nodes", "Node", False),
    Resource("", "v1", "pods", "Pod", True),
    Resource("", "v1", "namespaces", "Namespace", False),
    Resource("", "v1", "configmaps", "ConfigMap", True),
    Resource("", "v1", "events", "Event", True),
    Resource("coordination.k8s.io", "v1", "leases", "Lease", True),
    Resource("topology.node.k8s.io", "v1alpha1", "noderesourcetopologies", "NodeResourceTopology", False),
    Resource("scheduling.koordinator.sh", "v1alpha1", "devices", "Device", False),
    Resource("scheduling.koordinator.sh", "v1alpha1", "reservations", "Reservation", False),
    Resource("slo.koordinator.sh", "v1alpha1", "nodeslos", "NodeSLO", False),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
)

# list fields merged by key under strategic merge patch (the common core types)
SMP_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "tolerations": "key",
    "taints": "key",
    "ownerReferences": "uid",
    "webhooks": "name",  # Mutating/ValidatingWebhookConfiguration
}


class APIStatusError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details: JSON | None = None

    def status(self) -> JSON:
        out: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            out["details"] = self.details
        return out


def _not_found(res: Resource, name: str) -> APIStatusError:
    return APIStatusError(404, "NotFound", f'{res.plural} "{name}" not found')


def _conflict(res: Resource, name: str, why: str) -> APIStatusError:
    return APIStatusError(
        409, "Conflict", f'Operation cannot be fulfilled on {res.plural} "{name}": {why}'
    )


# -- patches ------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def strategic_merge_patch(target: Any, patch: Any, key: str = "") -> Any:
    """A subset of Kubernetes strategic merge patch (see module docstring)."""
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        if patch.get("$patch") == "delete":
            return None
        out = dict(target) if isinstance(target, dict) else {}
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                merged = strategic_merge_patch(out.get(k), v, k)
                if merged is None and isinstance(v, dict) and v.get("$patch") == "delete":
                    out.pop(k, None)
                else:
                    out[k] = merged
        return out
    if isinstance(patch, list) and key in SMP_MERGE_KEYS and isinstance(target, list):
        mkey = SMP_MERGE_KEYS[key]
        out_list = [copy.deepcopy(x) for x in target]
        for item in patch:
            if not isinstance(item, dict) or mkey not in item:
                out_list.append(copy.deepcopy(item))
                continue
            idx = next(
                (i for i, x in enumerate(out_list) if isinstance(x, dict) and x.get(mkey) == item[mkey]),
                None,
            )
            if item.get("$patch") == "delete":
                if idx is not None:
                    out_list.pop(idx)
            elif idx is None:
                out_list.append({k: v for k, v in item.items() if k != "$patch"})
            else:
                out_list[idx] = strategic_merge_patch(out_list[idx], item)
        return out_list
    return copy.deepcopy(patch)


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise APIStatusError(422, "Invalid", f"bad JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 add/remove/replace/test."""
    if not isinstance(ops, list):
        raise APIStatusError(400, "BadRequest", "json patch must be a list")
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _pointer(op.get("path", ""))
        parent: Any = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.get(p)
            if parent is None:
                raise APIStatusError(422, "Invalid", f"path {op.get('path')} does not exist")
        last = parts[-1]
        kind = op.get("op")
        if kind == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op.get("value"):
                raise APIStatusError(422, "Invalid", f"test operation failed at {op.get('path')}")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op.get("value"))
                elif kind == "add":
                    parent.insert(int(last), op.get("value"))
                else:
                    parent[int(last)] = op.get("value")
            else:
                if kind == "replace" and last not in parent:
                    raise APIStatusError(422, "Invalid", f"path {op.get('path')} does not exist")
                parent[last] = op.get("value")
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            elif last in parent:
                del parent[last]
            else:
                raise APIStatusError(422, "Invalid", f"path {op.get('path')} does not exist")
        else:
            raise APIStatusError(422, "Invalid", f"unsupported json patch op {kind!r}")
    return doc


# -- selectors ----------------------------------------------------------------------------------


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def _matches(obj: Mapping[str, Any], label_sel: str, field_sel: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in label_sel.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.split("=", 1)
            if labels.get(k.strip().rstrip("=")) != v.strip().lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    for term in filter(None, (t.strip() for t in field_sel.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if _field_value(obj, k.strip()) == v.strip():
                return False
        else:
            k, _, v = term.partition("=")
            if _field_value(obj, k.strip()) != v.strip().lstrip("="):
                return False
    return True


def _selector_matches(selector: Any, labels: Mapping[str, Any]) -> bool:
    """A ``metav1.LabelSelector`` (``matchLabels``, ``matchExpressions`` with In, NotIn,
    Exists, DoesNotExist) against ``labels``; an empty selector matches every object, a missing
    one none (as a PodDisruptionBudget's selector in policy/v1)."""
    if not isinstance(selector, dict):
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# -- the store ----------------------------------------------------------------------------------


@dataclass
class _Event:
    rv: int
    res: Resource
    namespace: str
    type: str
    obj: JSON
    line: bytes  # the serialised event, built once


@dataclass
class _Fault:
    method: str
    pattern: re.Pattern[str]
    code: int
    reason: str
    message: str
    times: int
    after: bool = False


@dataclass
class _Store:
    history: int
    resources: dict[tuple[str, str], Resource] = field(default_factory=dict)  # (group, plural)
    objects: dict[tuple[str, str], dict[tuple[str, str], JSON]] = field(default_factory=dict)
    events: list[_Event] = field(default_factory=list)
    first_rv: int = 1  # oldest rv still in ``events``
    rv: int = 1
    lock: threading.RLock = field(default_factory=threading.RLock)
    cond: threading.Condition = field(init=False)  # the store's lock, as a condition
    # one condition per resource on the same lock: an event wakes only that resource's
    # watchers (a Lease write used to wake every Node, Pod, NRT and Device watch thread)
    watch_conds: dict[tuple[str, str], threading.Condition] = field(default_factory=dict)
    closed: bool = False

    def __post_init__(self) -> None:
        self.cond = threading.Condition(self.lock)

    def register(self, res: Resource) -> None:
        self.resources[(res.group, res.plural)] = res
        self.objects.setdefault((res.group, res.plural), {})
        self.watch_conds.setdefault((res.group, res.plural), threading.Condition(self.lock))

    def watch_cond(self, res: Resource) -> threading.Condition:
        return self.watch_conds[(res.group, res.plural)]

    def notify_watchers(self) -> None:
        self.cond.notify_all()
        for c in self.watch_conds.values():
            c.notify_all()

    def _emit(self, res: Resource, etype: str, obj: JSON) -> None:
        ns = str((obj.get("metadata") or {}).get("namespace") or "")
        line = json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"
        self.events.append(_Event(self.rv, res, ns, etype, obj, line))
        if len(self.events) > self.history * 1.25:
            drop = len(self.events) - self.history
            self.events = self.events[drop:]
            self.first_rv = self.events[0].rv
        self.watch_cond(res).notify_all()

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)


class FakeAPIServer:
    """The server; ``start()`` runs it in a daemon thread on 127.0.0.1."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, history: int = 100_000) -> None:
        self.store = _Store(history=history)
        for res in DEFAULT_RESOURCES:
            self.store.register(res)
        self._faults: list[_Fault] = []
        self.counts: dict[str, int] = {}
        self.evictions: list[tuple[str, str, int]] = []  # (namespace, pod, HTTP code) per Eviction POST
        self.connections = 0  # TCP connections accepted so far
        self._streams = 0  # watch streams opened so far (each gets the next number)
        self._frozen: dict[str, int] = {}  # plural -> streams numbered up to this one are silent
        self._httpd = _HTTPServer((host, port), _Handler)
        self._httpd.api = self
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeAPIServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fakeapi", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.store.cond:
            self.store.closed = True
            self.store.notify_watchers()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def register(self, group: str, version: str, plural: str, kind: str, namespaced: bool) -> None:
        self.store.register(Resource(group, version, plural, kind, namespaced))

    def inject(
        self,
        method: str,
        path_regex: str,
        code: int = 500,
        *,
        times: int = 1,
        reason: str = "InternalError",
        message: str = "injected failure",
        after: bool = False,
    ) -> None:
        """Fail the next ``times`` requests whose method and path match. With ``after`` the
        request is carried out first and only its reply is the failure (a reply lost after the
        write, as a timeout or a dropped connection looks to the client)."""
        with self.store.cond:
            self._faults.append(
                _Fault(method.upper(), re.compile(path_regex), code, reason, message, times, after)
            )

    def _fault(self, method: str, path: str) -> tuple[APIStatusError, bool] | None:
        with self.store.cond:
            for f in self._faults:
                if f.times > 0 and f.method == method and f.pattern.search(path):
                    f.times -= 1
                    return APIStatusError(f.code, f.reason, f.message), f.after
        return None

    def freeze_watches(self, plural: str) -> None:
        """Silence the open watch streams of ``plural`` for good, without ending them."""
        with self.store.cond:
            self._frozen[plural] = self._streams
            self.store.notify_watchers()

    def watch_streams(self) -> int:
        """How many watch streams were opened so far."""
        with self.store.cond:
            return self._streams

    # -- direct access (no HTTP) --------------------------------------------------------------
    def resource(self, kind_or_plural: str) -> Resource:
        for res in self.store.resources.values():
            if kind_or_plural in (res.kind, res.plural):
                return res
        raise KeyError(kind_or_plural)

    def create(self, obj: Mapping[str, Any]) -> JSON:
        """Create an object from its ``kind`` (as POST would)."""
        res = self.resource(str(obj["kind"]))
        ns = str((obj.get("metadata") or {}).get("namespace") or ("default" if res.namespaced else ""))
        with self.store.cond:
            return copy.deepcopy(self._create(res, ns, copy.deepcopy(dict(obj))))

    def create_many(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """Bulk seeding (benchmarks): one lock, no copies of the caller's objects kept."""
        with self.store.cond:
            for obj in objs:
                res = self.resource(str(obj["kind"]))
                ns = str((obj.get("metadata") or {}).get("namespace") or ("default" if res.namespaced else ""))
                self._create(res, ns, dict(obj))

    def get(self, kind: str, name: str, namespace: str = "") -> JSON | None:
        res = self.resource(kind)
        with self.store.cond:
            obj = self.store.objects[(res.group, res.plural)].get((namespace if res.namespaced else "", name))
            return copy.deepcopy(obj) if obj is not None else None

    def objects(self, kind: str) -> list[JSON]:
        res = self.resource(kind)
        with self.store.cond:
            return [copy.deepcopy(o) for o in self.store.objects[(res.group, res.plural)].values()]

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        res = self.resource(kind)
        with self.store.cond:
            self._delete(res, namespace if res.namespaced else "", name)

    def patch_direct(self, kind: str, name: str, patch: Mapping[str, Any], namespace: str = "") -> JSON:
        res = self.resource(kind)
        with self.store.cond:
            key = (namespace if res.namespaced else "", name)
            return copy.deepcopy(self._patch(res, key, dict(patch), "application/merge-patch+json"))

    # -- operations (caller holds store.cond) -------------------------------------------------
    def _bucket(self, res: Resource) -> dict[tuple[str, str], JSON]:
        return self.store.objects[(res.group, res.plural)]

    def _create(self, res: Resource, ns: str, obj: JSON) -> JSON:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise APIStatusError(422, "Invalid", "metadata.name: Required value")
            meta["name"] = prefix + uuid.uuid4().hex[:5]
        name = str(meta["name"])
        if res.namespaced:
            meta["namespace"] = ns or "default"
        else:
            meta.pop("namespace", None)
        key = (meta.get("namespace", ""), name)
        bucket = self._bucket(res)
        if key in bucket:
            raise APIStatusError(409, "AlreadyExists", f'{res.plural} "{name}" already exists')
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        meta["resourceVersion"] = self.store.next_rv()
        meta.setdefault("generation", 1)
        bucket[key] = obj
        self.store._emit(res, "ADDED", obj)
        return obj

    def _stored(self, res: Resource, key: tuple[str, str]) -> JSON:
        obj = self._bucket(res).get(key)
        if obj is None:
            raise _not_found(res, key[1])
        return obj

    def _commit(self, res: Resource, key: tuple[str, str], new: JSON, precondition: str | None) -> JSON:
        old = self._stored(res, key)
        meta = new["metadata"] = dict(new.get("metadata") or {})  # never alias the stored object
        if precondition and precondition != old["metadata"]["resourceVersion"]:
            raise _conflict(res, key[1], "the object has been modified; please apply your changes "
                            "to the latest version and try again")
        if meta.get("name", key[1]) != key[1]:
            raise APIStatusError(400, "BadRequest", "the name of the object does not match the URL")
        for keep in ("uid", "creationTimestamp", "namespace", "name"):
            if keep in old["metadata"]:
                meta[keep] = old["metadata"][keep]
        if not res.namespaced:
            meta.pop("namespace", None)
        new["apiVersion"], new["kind"] = res.api_version, res.kind
        if new == old:
            return old  # a no-op write does not bump the version (as the real server)
        if {k: v for k, v in new.items() if k not in ("metadata", "status")} != {
            k: v for k, v in old.items() if k not in ("metadata", "status")
        }:
            meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
        meta["resourceVersion"] = self.store.next_rv()
        self._bucket(res)[key] = new
        self.store._emit(res, "MODIFIED", new)
        return new

    def _replace(self, res: Resource, key: tuple[str, str], body: JSON, sub: str) -> JSON:
        old = self._stored(res, key)
        pre = str((body.get("metadata") or {}).get("resourceVersion") or "") or None
        if sub == "status":
            new = copy.deepcopy(old)
            new["status"] = body.get("status")
        else:
            new = body
        return self._commit(res, key, new, pre)

    def _patch(self, res: Resource, key: tuple[str, str], patch: Any, ctype: str, sub: str = "") -> JSON:
        old = self._stored(res, key)
        if "json-patch" in ctype:
            new = json_patch(old, patch)
            pre = None
        elif "strategic-merge-patch" in ctype:
            if not isinstance(patch, dict):
                raise APIStatusError(400, "BadRequest", "strategic merge patch must be an object")
            new = strategic_merge_patch(old, patch)
            pre = str((patch.get("metadata") or {}).get("resourceVersion") or "") or None
        elif "merge-patch" in ctype:
            if not isinstance(patch, dict):
                raise APIStatusError(400, "BadRequest", "merge patch must be an object")
            new = merge_patch(old, patch)
            pre = str((patch.get("metadata") or {}).get("resourceVersion") or "") or None
        else:
            raise APIStatusError(415, "UnsupportedMediaType", f"the content type {ctype!r} is not supported")
        if sub == "status":
            kept = copy.deepcopy(old)
            kept["status"] = new.get("status")
            new = kept
        new["metadata"] = dict(new.get("metadata") or {})
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        return self._commit(res, key, new, pre)

    def _delete(self, res: Resource, ns: str, name: str, want_uid: str | None = None) -> JSON:
        key = (ns, name)
        obj = self._bucket(res).get(key)
        if obj is None:
            raise _not_found(res, name)
        if want_uid is not None and obj["metadata"].get("uid") != want_uid:
            raise APIStatusError(409, "Conflict", f"Precondition failed: UID in precondition: {want_uid}, UID in "
                                 f"object meta: {obj['metadata'].get('uid')}")
        self._bucket(res).pop(key)
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = self.store.next_rv()
        self.store._emit(res, "DELETED", obj)
        return obj

    def _bind(self, ns: str, name: str, body: JSON) -> JSON:
        res = self.resource("pods")
        key = (ns, name)
        pod = self._stored(res, key)
        want_uid = (body.get("metadata") or {}).get("uid")
        if want_uid and want_uid != pod["metadata"].get("uid"):
            raise _conflict(res, name, f"Precondition failed: UID in precondition: {want_uid}, "
                            f"UID in object meta: {pod['metadata'].get('uid')}")
        want_rv = (body.get("metadata") or {}).get("resourceVersion")
        if want_rv and want_rv != pod["metadata"].get("resourceVersion"):
            raise _conflict(res, name, "the object has been modified; please apply your changes "
                            "to the latest version and try again")
        node = (body.get("target") or {}).get("name")
        if not node:
            raise APIStatusError(422, "Invalid", "target.name: Required value")
        if (pod.get("spec") or {}).get("nodeName"):
            raise _conflict(res, name, f"pod {name} is already assigned to node "
                            f"\"{pod['spec']['nodeName']}\"")
        # copy only what changes: stored objects are never mutated in place, so versions may
        # share the rest (a deepcopy of the pod was most of a Binding's cost)
        new = dict(pod)
        new["spec"] = {**(pod.get("spec") or {}), "nodeName": node}
        extra = (body.get("metadata") or {}).get("annotations") or {}
        if extra:  # as kube-apiserver's BindingREST: the Binding's annotations merge into the pod
            meta = new["metadata"] = dict(pod["metadata"])
            meta["annotations"] = {**(meta.get("annotations") or {}), **extra}
        status = new["status"] = dict(pod.get("status") or {})
        conds = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conds.append({"type": "PodScheduled", "status": "True",
                      "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        status["conditions"] = conds
        self._commit(res, key, new, None)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _evict(self, ns: str, name: str, body: JSON) -> JSON:
        """The Eviction subresource (see the module docstring)."""
        res = self.resource("pods")
        if not isinstance(body, dict) or body.get("kind", "Eviction") != "Eviction":
            raise APIStatusError(400, "BadRequest", "the body of an eviction must be an Eviction")
        pod = self._stored(res, (ns, name))
        options = body.get("deleteOptions") or {}
        want_uid = ((options.get("preconditions") or {}) if isinstance(options, dict) else {}).get("uid")
        have_uid = pod["metadata"].get("uid")
        if want_uid and want_uid != have_uid:
            raise _conflict(res, name, f"Precondition failed: UID in precondition: {want_uid}, "
                            f"UID in object meta: {have_uid}")
        phase = (pod.get("status") or {}).get("phase")
        if phase not in ("Pending", "Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
            pdb_res = self.resource("PodDisruptionBudget")
            labels = (pod["metadata"].get("labels") or {})
            budgets = [
                (key, pdb) for key, pdb in sorted(self._bucket(pdb_res).items())
                if key[0] == ns and _selector_matches((pdb.get("spec") or {}).get("selector"), labels)
            ]
            if len(budgets) > 1:
                raise APIStatusError(500, "InternalError", "This pod has more than one PodDisruptionBudget, "
                                     "which the eviction subresource does not support.")
            if budgets:
                key, pdb = budgets[0]
                status = dict(pdb.get("status") or {})
                allowed = int(status.get("disruptionsAllowed") or 0)
                if allowed <= 0:
                    err = APIStatusError(429, "TooManyRequests",
                                         "Cannot evict pod as it would violate the pod's disruption budget.")
                    err.details = {"causes": [{"reason": "DisruptionBudget", "message": (
                        f"The disruption budget {key[1]} needs {status.get('desiredHealthy', 0)} healthy pods "
                        f"and has {status.get('currentHealthy', 0)} currently")}]}
                    raise err
                status["disruptionsAllowed"] = allowed - 1
                status["disruptedPods"] = {**(status.get("disruptedPods") or {}),
                                           name: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                self._commit(pdb_res, key, {**pdb, "status": status}, None)
        self._delete(res, ns, name)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _list(self, res: Resource, ns: str, query: Mapping[str, str]) -> JSON:
        label_sel, field_sel = query.get("labelSelector", ""), query.get("fieldSelector", "")
        limit = int(query.get("limit") or 0)
        token = query.get("continue", "")
        start_after: tuple[str, str] | None = None
        list_rv = str(self.store.rv)
        if token:
            try:
                state = json.loads(base64.urlsafe_b64decode(token.encode()))
                start_after, list_rv = (state["ns"], state["name"]), state["rv"]
            except (ValueError, KeyError):
                raise APIStatusError(400, "BadRequest", "invalid continue token") from None
        keys = sorted(k for k in self._bucket(res) if not ns or k[0] == ns)
        if start_after is not None:
            keys = [k for k in keys if k > start_after]
        items: list[JSON] = []
        more = ""
        bucket = self._bucket(res)
        for i, k in enumerate(keys):
            obj = bucket[k]
            if not _matches(obj, label_sel, field_sel):
                continue
            items.append(obj)
            if limit and len(items) >= limit and i + 1 < len(keys):
                more = base64.urlsafe_b64encode(
                    json.dumps({"ns": k[0], "name": k[1], "rv": list_rv}).encode()
                ).decode()
                break
        meta: JSON = {"resourceVersion": list_rv}
        if more:
            meta["continue"] = more
        return {"apiVersion": res.api_version, "kind": f"{res.kind}List", "metadata": meta, "items": items}

    # -- watch --------------------------------------------------------------------------------
    def _watch(self, res: Resource, ns: str, query: Mapping[str, str]) -> Iterator[bytes]:
        label_sel, field_sel = query.get("labelSelector", ""), query.get("fieldSelector", "")
        timeout = float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        deadline = time.monotonic() + timeout
        store = self.store
        wakeup = store.watch_cond(res)
        rv_param = query.get("resourceVersion", "")
        with store.cond:
            self._streams += 1
            number = self._streams
        with store.cond:
            if rv_param in ("", "0"):
                initial = [
                    json.dumps({"type": "ADDED", "object": o}, separators=(",", ":")).encode() + b"\n"
                    for k, o in sorted(self._bucket(res).items())
                    if (not ns or k[0] == ns) and _matches(o, label_sel, field_sel)
                ]
                since = store.rv
            else:
                try:
                    since = int(rv_param)
                except ValueError:
                    raise APIStatusError(400, "BadRequest", f"invalid resourceVersion {rv_param!r}") from None
                initial = []
                if since < store.first_rv - 1:
                    gone = APIStatusError(410, "Expired", f"too old resource version: {since} ({store.first_rv - 1})")
                    yield json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n"
                    return
        yield from initial
        while True:
            with store.cond:
                while not store.closed and (
                    number <= self._frozen.get(res.plural, 0) or not store.events or store.events[-1].rv <= since
                ):
                    if number <= self._frozen.get(res.plural, 0):
                        wakeup.wait(1.0)  # half-open: nothing more, not even the end
                        continue
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wakeup.wait(min(left, 1.0))
                if store.closed:
                    return
                if since < store.first_rv - 1:
                    gone = APIStatusError(410, "Expired", "too old resource version")
                    yield json.dumps({"type": "ERROR", "object": gone.status()}).encode() + b"\n"
                    return
                batch = self._events_after(since)
                last_rv = store.rv
            out = []
            for ev in batch:
                since = ev.rv
                if ev.res is not res or (ns and ev.namespace != ns):
                    continue
                if (label_sel or field_sel) and not _matches(ev.obj, label_sel, field_sel):
                    continue
                out.append(ev.line)
            if out:
                yield b"".join(out)
            if time.monotonic() >= deadline:
                if bookmarks:
                    mark = {"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": res.api_version,
                                                          "metadata": {"resourceVersion": str(last_rv)}}}
                    yield json.dumps(mark).encode() + b"\n"
                return

    def _events_after(self, rv: int) -> list[_Event]:
        events = self.store.events
        lo, hi = 0, len(events)
        while lo < hi:  # binary search: first event with rv > given
            mid = (lo + hi) // 2
            if events[mid].rv <= rv:
                lo = mid + 1
            else:
                hi = mid
        return events[lo:]

    # -- routing ------------------------------------------------------------------------------
    def route(self, path: str) -> tuple[Resource, str, str, str]:
        """(resource, namespace, name, subresource) for a REST path, or an API error."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise APIStatusError(404, "NotFound", f"the server could not find the requested resource {path}")
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        elif len(rest) == 2 and rest[0] == "namespaces" and not group:
            rest = ["namespaces", rest[1]]
        if not rest:
            raise APIStatusError(404, "NotFound", "no resource in path")
        res = self.store.resources.get((group, rest[0]))
        if res is None or res.version != version:
            raise APIStatusError(404, "NotFound", f"the server could not find the requested resource {path}")
        if ns and not res.namespaced:
            raise APIStatusError(404, "NotFound", f"{res.plural} is not namespaced")
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        return res, ns, name, sub

    def discovery(self, path: str) -> JSON | None:
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0-fakeapi", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            groups: dict[str, set[str]] = {}
            for res in self.store.resources.values():
                if res.group:
                    groups.setdefault(res.group, set()).add(res.version)
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in sorted(vs)],
                        "preferredVersion": {"groupVersion": f"{g}/{sorted(vs)[-1]}", "version": sorted(vs)[-1]},
                    }
                    for g, vs in sorted(groups.items())
                ],
            }
        m = re.fullmatch(r"/api/v1|/apis/([^/]+)/([^/]+)", path)
        if m:
            group, version = (m.group(1) or ""), (m.group(2) or "v1")
            return {
                "kind": "APIResourceList",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": [
                    {"name": r.plural, "singularName": r.kind.lower(), "namespaced": r.namespaced,
                     "kind": r.kind, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                    for r in self.store.resources.values()
                    if r.group == group and r.version == version
                ],
            }
        return None


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    api: FakeAPIServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (watchers being stopped) are normal, not errors."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError | OSError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.api.connections += 1
        # headers and body go out in separate writes: without this, Nagle plus delayed ACK
        # add 40 ms to every response
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    _reply_fault: APIStatusError | None = None

    def _send(self, code: int, body: Mapping[str, Any] | list[Any]) -> None:
        if self._reply_fault is not None:
            code, body, self._reply_fault = self._reply_fault.code, self._reply_fault.status(), None
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise APIStatusError(400, "BadRequest", "request body is not JSON") from None

    def _handle(self, method: str) -> None:
        api = self.server.api
        split = urlsplit(self.path)
        path = split.path.rstrip("/") or "/"
        query = {k: v[-1] for k, v in parse_qs(split.query).items()}
        api.counts[method] = api.counts.get(method, 0) + 1
        try:
            fault = api._fault(method, path)
            self._reply_fault = None
            if fault is not None:
                if fault[1]:
                    self._reply_fault = fault[0]  # carried out below; ``_send`` swaps the reply
                else:
                    self._body()
                    raise fault[0]
            if method == "GET":
                doc = api.discovery(path)
                if doc is not None:
                    self._send(200, doc)
                    return
            res, ns, name, sub = api.route(path)
            store = api.store
            if method == "GET" and not name:
                if query.get("watch") in ("true", "1"):
                    self._stream(api._watch(res, ns, query))
                    return
                with store.cond:
                    doc = api._list(res, ns, query)
                    data = json.dumps(doc, separators=(",", ":")).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            key = (ns if res.namespaced else "", name)
            if method == "GET":
                with store.cond:
                    obj = api._stored(res, key)
                    self._send(200, obj)
                return
            if method == "POST" and res.plural == "pods" and sub == "binding":
                body = self._body()
                with store.cond:
                    self._send(201, api._bind(ns, name, body))
                return
            if method == "POST" and res.plural == "pods" and sub == "eviction":
                body = self._body()
                with store.cond:
                    try:
                        reply = api._evict(ns, name, body)
                    except APIStatusError as exc:
                        api.evictions.append((ns, name, exc.code))
                        raise
                    api.evictions.append((ns, name, 201))
                    self._send(201, reply)
                return
            if method == "POST" and not name:
                body = self._body()
                with store.cond:
                    self._send(201, api._create(res, ns, body))
                return
            if method == "PUT" and name:
                body = self._body()
                with store.cond:
                    self._send(200, api._replace(res, key, body, sub))
                return
            if method == "PATCH" and name:
                body = self._body()
                ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                with store.cond:
                    self._send(200, api._patch(res, key, body, ctype, sub))
                return
            if method == "DELETE" and name:
                options = self._body()
                want_uid = ((options.get("preconditions") or {}) if isinstance(options, dict) else {}).get("uid")
                with store.cond:
                    self._send(200, api._delete(res, key[0], name, want_uid))
                return
            raise APIStatusError(405, "MethodNotAllowed", f"{method} is not supported on {path}")
        except APIStatusError as exc:
            self._send(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _stream(self, chunks: Iterator[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for data in chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        except APIStatusError as exc:  # raised before the first chunk (bad resourceVersion)
            data = json.dumps({"type": "ERROR", "object": exc.status()}).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Run the fake Kubernetes API server.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--load", default="", help="JSON file with a list of objects to create first")
    args = parser.parse_args()
    server = FakeAPIServer(port=args.port, history=args.history)
    if args.load:
        with open(args.load, encoding="utf-8") as fh:
            server.create_many(json.load(fh))
        server.store.events.clear()  # seeding is history nobody watched
        server.store.first_rv = server.store.rv
        import gc

        gc.collect()
        gc.freeze()  # the seeded objects live forever: keep GC passes short
    server.start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
