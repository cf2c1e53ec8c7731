"""The node config file's document: its bounds, its one parser, and the process that runs it.

``load_document`` parses (YAML or JSON) and validates a node config file
(``NodeConfigDocument``; the NodeSLO spec by ``koord_formats.nodeslo.validate_node_slo``);
``doctor`` calls it directly. A daemon never runs it in its own process: PyYAML and pydantic take
seconds of CPU over a file near ``MAX_NODE_CONFIG_BYTES``, create hundreds of thousands of
objects (and cyclic-collector passes over them), and one pydantic call holds the GIL for as long
as it runs, which a worker thread cannot hide from the event loop. ``parse_in_worker`` (called
from a worker thread of ``runtime_proxy.state.nodeconfig.NodeConfig``) runs it in a short-lived
child process instead, one per changed file: the text goes in on stdin, the validated document
comes back on stdout as plain data (``NodeDocument.to_wire``: each mapping in pickled slices of
a couple of thousand entries, so that the daemon loads it in short calls between which the GIL
can pass), loaded with an unpickler that refuses every class. The child runs at nice 10 under a
CPU limit and is killed past a wall-clock deadline. It imports pydantic, PyYAML and
``koord_formats``, nothing else of ours.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Never, NoReturn

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from koord_formats.bounded import MAX_ANNOTATION_CHARS
from koord_formats.nodeslo import validate_node_slo
from rhp_ops.yamlsafe import DocumentError, load_yaml

__all__ = [
    "MAX_NODE_CONFIG_BYTES",
    "MAX_NODE_SLO_BYTES",
    "PARSE_CPU_SECONDS",
    "PARSE_DEADLINE_SECONDS",
    "NodeConfigDocument",
    "NodeConfigRejected",
    "NodeDocument",
    "load_document",
    "parse_in_worker",
    "worker_command",
    "worker_main",
]

# What one node's config can hold: the Node's annotations and the NodeResourceTopology's
# annotations, each at most 256 KiB (the API server's cap on one object's annotations; the largest
# legitimate one, node.koordinator.sh/cpu-topology of 4096 CPUs, is 177-198 KiB, 230 KiB with
# its quotes escaped in a JSON file), plus labels and the NodeSLO spec, a few KiB each on a real
# node. 1 MiB holds both annotation sets at their cap, escaped, with room to spare.
MAX_NODE_CONFIG_BYTES = 1 << 20
# Koordinator's NodeSLO spec is a few KiB; its JSON may be this large (it crosses to the daemon in
# one pickle, loaded in one call of the unpickler: a few milliseconds at this size).
MAX_NODE_SLO_BYTES = 256 << 10
# The parser process of a file of MAX_NODE_CONFIG_BYTES needs about 5 s of CPU (pure-Python YAML);
# past PARSE_CPU_SECONDS of CPU the kernel ends it (RLIMIT_CPU), past PARSE_DEADLINE_SECONDS of
# wall-clock time the daemon kills it (it runs at nice 10, so a loaded node slows it down).
PARSE_CPU_SECONDS = 20
PARSE_DEADLINE_SECONDS = 120.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class _NRTModel(_Model):
    annotations: dict[str, StrictStr] = Field(default_factory=dict)


class _CgroupModel(_Model):
    version: Literal[1, 2] | None = None
    driver: Literal["cgroupfs", "systemd"] | None = None


class NodeConfigDocument(BaseModel):
    """The local node config file: ``name``, ``labels``, ``annotations`` (node annotations),
    ``nodeResourceTopology.annotations``, ``nodeSLO`` (the NodeSLO spec), optional ``cgroup``."""

    model_config = ConfigDict(extra="forbid")

    name: StrictStr = ""
    labels: dict[str, StrictStr] = Field(default_factory=dict)
    annotations: dict[str, StrictStr] = Field(default_factory=dict)
    nodeResourceTopology: _NRTModel = Field(default_factory=_NRTModel)
    nodeSLO: dict[str, Any] = Field(default_factory=dict)  # Any: JSON, checked by validate_node_slo
    cgroup: _CgroupModel | None = None


class NodeConfigRejected(ValueError):
    """A node config file that was not taken. ``reason`` is the metric label: ``invalid`` (it
    does not validate), ``timeout`` (not parsed within the deadline), ``worker-failed`` (the
    parser process could not start, crashed or answered nonsense)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def _annotations_size(annotations: Mapping[str, str]) -> int:
    """Bytes of keys and values, as the API server counts an object's annotations."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())


def _not_json(value: object) -> str:
    """Where ``value`` holds something JSON cannot (a YAML timestamp, binary, set, a key that is
    not a string, a non-finite number), as a dotted path; "" when it is all JSON data."""
    todo: list[tuple[str, object]] = [("", value)]
    while todo:
        path, item = todo.pop()
        if isinstance(item, dict):
            for key, sub in item.items():
                if not isinstance(key, str):
                    return f"{path}.{key!r}"
                todo.append((f"{path}.{key}", sub))
        elif isinstance(item, list):
            todo.extend((f"{path}[{i}]", sub) for i, sub in enumerate(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                return path
        elif item is not None and not isinstance(item, (str, bool, int)):
            return path
    return ""


def load_document(text: str) -> NodeConfigDocument:
    """Parse (YAML or JSON) and validate a node config file; ``ValueError`` when bad (larger
    than ``MAX_NODE_CONFIG_BYTES``, not YAML, nested too deeply, wrong shape, annotations over
    the API server's 256 KiB, a NodeSLO that is not JSON data, larger than ``MAX_NODE_SLO_BYTES``
    as JSON or does not validate)."""
    if len(text) > MAX_NODE_CONFIG_BYTES:
        raise ValueError(f"larger than {MAX_NODE_CONFIG_BYTES} bytes")
    try:  # the one YAML reader: bounded, no anchors or aliases
        data = load_yaml(text, max_bytes=4 * MAX_NODE_CONFIG_BYTES) if text.strip() else {}
    except DocumentError as exc:
        raise ValueError(f"not YAML/JSON: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ValueError("the node config must be a mapping")
    try:
        doc = NodeConfigDocument.model_validate(dict(data))
        for key, annotations in (("annotations", doc.annotations),
                                 ("nodeResourceTopology.annotations", doc.nodeResourceTopology.annotations)):
            size = _annotations_size(annotations)
            if size > MAX_ANNOTATION_CHARS:
                raise ValueError(f"{key}: {size} bytes; the API server allows {MAX_ANNOTATION_CHARS} per object")
        where = _not_json(doc.nodeSLO)
        if where:
            raise ValueError(f"nodeSLO{where}: not JSON data (a YAML timestamp, binary, set or non-string key?)")
        size = len(json.dumps(doc.nodeSLO, separators=(",", ":"), ensure_ascii=False).encode())
        if size > MAX_NODE_SLO_BYTES:
            raise ValueError(f"nodeSLO: {size} bytes as JSON; at most {MAX_NODE_SLO_BYTES}")
        validate_node_slo(doc.nodeSLO)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc
    return doc


_EMPTY: Mapping[str, Never] = MappingProxyType({})
# Entries per slice of a mapping on the wire: unpickling one slice is one call of the C unpickler
# that holds the GIL (about a millisecond for this many labels).
_WIRE_SLICE = 2048


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain data only: any class or function named in the stream is refused."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def _plain_loads(blob: bytes) -> object:
    return _PlainUnpickler(io.BytesIO(blob)).load()


def _slices(mapping: Mapping[str, str]) -> list[bytes]:
    items = list(mapping.items())
    return [pickle.dumps(dict(items[i:i + _WIRE_SLICE]), protocol=pickle.HIGHEST_PROTOCOL)
            for i in range(0, len(items), _WIRE_SLICE)]


def _joined(blobs: object) -> dict[str, str]:
    """The mapping of strings ``_slices`` cut up. Only the keys' and values' container is checked:
    the parser process wrote them from a validated document (``NodeConfigDocument``)."""
    if not (isinstance(blobs, list) and all(isinstance(b, bytes) for b in blobs)):
        raise ValueError("not a node document")
    out: dict[str, str] = {}
    for blob in blobs:  # one short GIL-holding call per slice; the GIL can pass to other threads between them
        part = _plain_loads(blob)
        if not isinstance(part, dict):
            raise ValueError("not a node document")
        out.update(part)
    return out


@dataclass(frozen=True)
class NodeDocument:
    """A validated node config file as plain data: what ``NodeConfig`` builds ``NodeFacts`` from."""

    name: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    nrt_annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    node_slo: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)  # Any: the NodeSLO spec as JSON
    cgroup_version: int | None = None
    cgroup_driver: str | None = None

    @classmethod
    def from_model(cls, doc: NodeConfigDocument) -> NodeDocument:
        cg = doc.cgroup
        return cls(doc.name, doc.labels, doc.annotations, doc.nodeResourceTopology.annotations, doc.nodeSLO,
                   cg.version if cg else None, cg.driver if cg else None)

    def to_wire(self) -> tuple[str, int | None, str | None, bytes, list[bytes], list[bytes], list[bytes]]:
        """The document as plain data (no class of ours) for the pipe from the parser process:
        each mapping of strings in pickled slices of ``_WIRE_SLICE`` entries, the NodeSLO spec
        (at most ``MAX_NODE_SLO_BYTES``) in one pickle, so that ``from_wire`` never spends long
        in one call of the unpickler."""
        return (self.name, self.cgroup_version, self.cgroup_driver,
                pickle.dumps(dict(self.node_slo), protocol=pickle.HIGHEST_PROTOCOL),
                _slices(self.labels), _slices(self.annotations), _slices(self.nrt_annotations))

    @classmethod
    def from_wire(cls, wire: object) -> NodeDocument:
        """``to_wire``'s value back; ``ValueError`` (or ``pickle.UnpicklingError``) when it is not one."""
        if not (isinstance(wire, tuple) and len(wire) == 7):
            raise ValueError("not a node document")
        name, version, driver, slo_blob, labels, annotations, nrt = wire
        if not (isinstance(name, str) and isinstance(slo_blob, bytes)
                and (version is None or isinstance(version, int)) and (driver is None or isinstance(driver, str))):
            raise ValueError("not a node document")
        slo = _plain_loads(slo_blob)
        if not isinstance(slo, dict):
            raise ValueError("not a node document")
        return cls(name, _joined(labels), _joined(annotations), _joined(nrt), slo, version, driver)


# ---- the parser process ------------------------------------------------------------------------

# Run as ``python -P -c _BOOT ROOT CPU``: nice 10 (in the daemon's cgroup the parse yields the CPU
# to the daemon's event loop; other cgroups are weighed by their cgroup's weight as before), at
# most CPU seconds of CPU and no core file; ROOT (the directory this package was imported from)
# goes on sys.path when it is not there already, so the child runs the same code as its parent.
_BOOT = ("import os, resource, sys\n"
         "os.nice(10)\n"
         "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
         "resource.setrlimit(resource.RLIMIT_CPU, (int(sys.argv[2]), int(sys.argv[2]) + 1))\n"
         "if sys.argv[1] not in sys.path:\n"
         "    sys.path.insert(0, sys.argv[1])\n"
         "from runtime_proxy.state.nodedoc import worker_main\n"
         "worker_main()\n")


def worker_command(cpu_seconds: int = PARSE_CPU_SECONDS) -> list[str]:
    """The command line of the parser process: this interpreter, the same code."""
    root = str(Path(__file__).resolve().parents[2])
    return [sys.executable, "-P", "-c", _BOOT, root, str(cpu_seconds)]


def worker_main() -> None:
    """The parser process: a node config file's text on stdin; on stdout a pickle of
    ``("ok", NodeDocument.to_wire())`` or ``("invalid", why)``."""
    data = sys.stdin.buffer.read(4 * MAX_NODE_CONFIG_BYTES + 1)
    try:
        result: tuple[str, object] = ("ok", NodeDocument.from_model(load_document(data.decode("utf-8"))).to_wire())
    except (ValueError, UnicodeDecodeError) as exc:  # pydantic's ValidationError is a ValueError
        result = ("invalid", str(exc))
    sys.stdout.buffer.write(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()


def _last_line(err: bytes) -> str:
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else "no message"


def parse_in_worker(
    text: str,
    *,
    deadline: float = PARSE_DEADLINE_SECONDS,
    cpu_seconds: int = PARSE_CPU_SECONDS,
    command: list[str] | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> NodeDocument:
    """``load_document(text)`` in a child process (``worker_command(cpu_seconds)``, or
    ``command``), as a ``NodeDocument``. Blocks until the child answers: call it from a worker
    thread. ``NodeConfigRejected`` when the document does not validate, or the child fails, uses
    more than ``cpu_seconds`` of CPU or outlives ``deadline`` seconds (it is then killed).
    ``started(proc)`` is called with the child's ``Popen`` once it runs (so that an owner can kill
    it on shutdown)."""
    try:
        proc = subprocess.Popen(command or worker_command(cpu_seconds), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/", close_fds=True)
    except OSError as exc:
        raise NodeConfigRejected("worker-failed", f"cannot start the parser process: {exc}") from None
    if started is not None:
        started(proc)
    try:
        out, err = proc.communicate(text.encode("utf-8"), timeout=deadline)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise NodeConfigRejected("timeout",
                                 f"not parsed within {deadline:g} s; the parser process was killed") from None
    if proc.returncode == -signal.SIGXCPU:
        raise NodeConfigRejected("timeout", f"not parsed within {cpu_seconds} s of CPU; the parser process was ended")
    if proc.returncode != 0:
        raise NodeConfigRejected("worker-failed",
                                 f"the parser process exited with {proc.returncode}: {_last_line(err)}")
    try:
        answer = _plain_loads(out)
        if not (isinstance(answer, tuple) and len(answer) == 2):
            raise ValueError("not a (status, payload) pair")
        status, payload = answer
        if status == "invalid" and isinstance(payload, str):
            raise NodeConfigRejected("invalid", payload)
        if status != "ok":
            raise ValueError(f"unknown status {status!r}")
        return NodeDocument.from_wire(payload)
    except NodeConfigRejected:
        raise
    except Exception as exc:  # a garbled answer: any error of the unpickler
        raise NodeConfigRejected("worker-failed", f"the parser process answered nonsense: {exc}") from None
