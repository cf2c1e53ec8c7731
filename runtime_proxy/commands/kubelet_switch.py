"""``runtime-proxy kubelet-switch``: point kubelet at the proxy, or back at containerd.

kubelet names its runtime in its config file (``KubeletConfiguration``'s
``containerRuntimeEndpoint``, YAML or JSON) and/or with the ``--container-runtime-endpoint`` flag
in a flags file (kubeadm's ``/var/lib/kubelet/kubeadm-flags.env`` or a systemd drop-in).

Every edit changes that one value and nothing else, and is checked before anything is written:
the file is parsed before and after the edit, and the two documents must differ only in
``containerRuntimeEndpoint`` (flags files: only in the flag's values). A YAML file is edited as
text where the parser says the value is (comments, order and every other line stay); a JSON
file, which has no comments, is written back re-serialised with two-space indentation in its
key order. Each file is written atomically (a temporary file in the same directory, its mode and
owner, then a rename), at the real target when the path is a symlink (the symlink stays), then
read back and checked again. Anything that cannot be done exactly (not a mapping, another kind,
the key twice, an alias, a flow mapping the key must be added to, a file that is not a regular
file: ``rhp_ops.files.read_regular_file``) is exit 2 with nothing changed; when writing the
second file fails, the first is restored.

The file as it was before the first switch is kept in ``FILE.rhp-backup``. Switching to the proxy
happens only when ``runtime-proxy doctor`` passes (``runtime_proxy.commands.doctor``, the same flags) and
the proxy's ``/readyz`` answers 200; then kubelet is restarted with the restart command
(``systemctl restart kubelet`` by default; a test gives its own or ``--no-restart``). If the
restart fails, the files are restored and kubelet restarted again. ``--to containerd`` sets the
endpoint back to the value the backup holds (absent in the backup: the key is removed again; no
backup: ``--containerd-endpoint``), leaving every other setting as it is now, and restarts
kubelet, with no checks: rolling back must always be possible.

``--to containerd --if-on-proxy`` is the guard the Debian package's prerm runs before it stops the
proxy (``packaging/deb/prerm``): it rolls back only the files that name the proxy's endpoint (a
missing file, or one naming anything else, is left alone), does nothing and exits 0 when none
does, and, when kubelet's restart fails, puts the files back as they were (naming the proxy, the
backups kept) and exits 1: the caller must then leave the proxy running, since kubelet still uses
it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from rhp_ops.files import FileRefused, read_text_file
from rhp_ops.yamlsafe import DocumentError, NoAliasLoader, load_yaml
from runtime_proxy.commands import HELP, doctor

__all__ = [
    "EXIT_CODES",
    "SwitchError",
    "add_arguments",
    "add_parser",
    "config_endpoint",
    "flag_endpoint",
    "main_from_args",
    "on_proxy",
    "rollback_if_on_proxy",
    "set_config_endpoint",
    "set_flag_endpoint",
]

PROXY_ENDPOINT = "unix:///var/run/koord-runtimeproxy/runtimeproxy.sock"
CONTAINERD_ENDPOINT = "unix:///run/containerd/containerd.sock"
BACKUP_SUFFIX = ".rhp-backup"
MAX_FILE_BYTES = 1 << 20
KEY = "containerRuntimeEndpoint"
EXIT_CODES = """\
exit codes:
  0  kubelet's files name the wanted endpoint (and kubelet was restarted unless --no-restart)
  1  refused or failed: doctor failed, /readyz is not 200, or the restart failed (the files were
     restored and kubelet restarted on its old endpoint)
  2  bad command line, or a kubelet file that cannot be read, parsed, edited exactly or written
     (nothing is left changed)
"""

_FLAG = re.compile(r"--container-runtime-endpoint(=|[ \t]+)(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']+)")
# An endpoint written as a plain YAML scalar; anything else is written double-quoted.
_PLAIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/*[A-Za-z0-9_./@-]*")


class SwitchError(Exception):
    """A kubelet file cannot be used or edited exactly (exit 2); the message names it."""


def _read(path: Path) -> str:
    try:
        return read_text_file(path, limit=MAX_FILE_BYTES)
    except FileRefused as exc:
        raise SwitchError(f"{path}: {exc.message}") from None


# ---- the KubeletConfiguration: parse, edit one value, verify ---------------------------------


def _is_json(text: str) -> bool:
    return text.lstrip().startswith("{")


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise SwitchError(f"the key {key!r} appears twice")
        out[key] = value
    return out


def _parse_config(text: str) -> dict[str, object]:
    """The KubeletConfiguration in ``text`` (JSON when it starts with ``{``, else YAML)."""
    try:
        if _is_json(text):
            doc = json.loads(text, object_pairs_hook=_no_duplicates)
        else:
            doc = load_yaml(text, max_bytes=MAX_FILE_BYTES) if text.strip() else {}
            root = yaml.compose(text, Loader=NoAliasLoader) if isinstance(doc, dict) and doc else None
            names = [k.value for k, _ in root.value if isinstance(k, yaml.ScalarNode)] \
                if isinstance(root, yaml.MappingNode) else []
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise SwitchError(f"the key {twice[0]!r} appears twice")
    except json.JSONDecodeError as exc:
        raise SwitchError(f"not JSON: {exc}") from None
    except DocumentError as exc:
        raise SwitchError(f"not YAML: {str(exc)[:200]}") from None
    except yaml.YAMLError as exc:
        raise SwitchError(f"not YAML: {' '.join(str(exc).split())[:200]}") from None
    except RecursionError:
        raise SwitchError("nested too deeply") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise SwitchError("not a KubeletConfiguration mapping")
    if doc.get("kind", "KubeletConfiguration") != "KubeletConfiguration":
        raise SwitchError(f"kind is {doc.get('kind')!r}, not KubeletConfiguration")
    return doc


def config_endpoint(text: str) -> str | None:
    """The ``containerRuntimeEndpoint`` of a KubeletConfiguration (None when absent)."""
    value = _parse_config(text).get(KEY)
    if value is not None and not isinstance(value, str):
        raise SwitchError(f"{KEY} is not a string")
    return value


def _yaml_scalar(value: str) -> str:
    plain = _PLAIN.fullmatch(value) is not None and load_yaml(value, max_bytes=MAX_FILE_BYTES) == value
    return value if plain else json.dumps(value)


def _edit_yaml(text: str, endpoint: str | None) -> str:
    """``text`` with the top-level value of ``KEY`` replaced where the parser found it, the key
    added after the last one, or (``endpoint`` None) its lines removed."""
    try:
        root = yaml.compose(text, Loader=NoAliasLoader) if text.strip() else None
    except yaml.YAMLError as exc:
        raise SwitchError(f"not YAML: {' '.join(str(exc).split())[:200]}") from None
    if root is None:
        return text if endpoint is None else text + ("" if not text or text.endswith("\n") else "\n") + \
            f"{KEY}: {_yaml_scalar(endpoint)}\n"
    if not isinstance(root, yaml.MappingNode):
        raise SwitchError("not a KubeletConfiguration mapping")
    pairs = [(k, v) for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == KEY]
    if len(pairs) > 1:
        raise SwitchError(f"the key {KEY!r} appears twice")
    if pairs:
        key, value = pairs[0]
        if value.tag != "tag:yaml.org,2002:null" and not isinstance(value, yaml.ScalarNode):
            raise SwitchError(f"{KEY} is not a string")
        start, end = value.start_mark.index, value.end_mark.index
        if endpoint is not None:
            scalar = _yaml_scalar(endpoint)
            if start == end and not text[start - 1 : start].isspace():
                scalar = " " + scalar
            return text[:start] + scalar + text[end:]
        if root.flow_style:
            raise SwitchError(f"cannot remove {KEY} from a flow mapping exactly; remove it by hand")
        line_start = text.rfind("\n", 0, key.start_mark.index) + 1
        if text[line_start : key.start_mark.index].strip():
            raise SwitchError(f"{KEY} does not start its line; remove it by hand")
        rest = text[end:]
        newline = rest.find("\n")
        tail = rest if newline < 0 else rest[:newline]
        if tail.strip() and not tail.strip().startswith("#"):
            raise SwitchError(f"{KEY}'s line holds more than its value; remove it by hand")
        return text[:line_start] + (rest[newline + 1 :] if newline >= 0 else "")
    if endpoint is None:
        return text
    if root.flow_style or not root.value:
        raise SwitchError(f"cannot add {KEY} to a flow mapping exactly; add it by hand")
    first_key, last_value = root.value[0][0], root.value[-1][1]
    indent = " " * first_key.start_mark.column
    at = last_value.end_mark.index
    if last_value.end_mark.column != 0:
        newline = text.find("\n", at)
        at = len(text) if newline < 0 else newline + 1
    before = text[:at] + ("" if at == 0 or text[:at].endswith("\n") else "\n")
    return before + f"{indent}{KEY}: {_yaml_scalar(endpoint)}\n" + text[at:]


def _edit_json(doc: dict[str, object], endpoint: str | None) -> str:
    out = dict(doc)
    if endpoint is None:
        out.pop(KEY, None)
    else:
        out[KEY] = endpoint
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"


def _verify_config(before: dict[str, object], text: str, endpoint: str | None) -> None:
    """``text`` parses to ``before`` with only ``KEY`` set to ``endpoint`` (None: absent)."""
    try:
        after = _parse_config(text)
    except SwitchError as exc:
        raise SwitchError(f"the edit would not parse ({exc}); nothing written") from None
    others = {k: v for k, v in after.items() if k != KEY}
    if others != {k: v for k, v in before.items() if k != KEY} or after.get(KEY) != endpoint \
            or (endpoint is None and KEY in after):
        raise SwitchError(f"cannot change only {KEY} in this file exactly; nothing written")


def set_config_endpoint(text: str, endpoint: str | None) -> str:
    """``text`` (a KubeletConfiguration, YAML or JSON) with ``containerRuntimeEndpoint`` set to
    ``endpoint`` (None: removed), and nothing else changed: verified by parsing the result.
    Raises ``SwitchError`` when the text is not a KubeletConfiguration mapping or the edit
    cannot be made exactly."""
    before = _parse_config(text)
    current = before.get(KEY)
    if current is not None and not isinstance(current, str):
        raise SwitchError(f"{KEY} is not a string")
    if current == endpoint and (endpoint is not None or KEY not in before):
        return text
    new = _edit_json(before, endpoint) if _is_json(text) else _edit_yaml(text, endpoint)
    _verify_config(before, new, endpoint)
    return new


# ---- the flags file ----------------------------------------------------------------------------


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'" else value


def flag_endpoint(text: str) -> str:
    """The ``--container-runtime-endpoint`` value of a flags file; ``SwitchError`` when the flag
    is not there or its occurrences disagree."""
    values = {_unquote(m.group(2)) for m in _FLAG.finditer(text)}
    if not values:
        raise SwitchError("has no --container-runtime-endpoint flag to change")
    if len(values) > 1:
        raise SwitchError(f"names --container-runtime-endpoint {len(values)} different ways")
    return values.pop()


def set_flag_endpoint(text: str, endpoint: str) -> str:
    """``text`` (a flags file) with every ``--container-runtime-endpoint`` value replaced by
    ``endpoint``, verified: the text outside the flags' values is unchanged. Raises
    ``SwitchError`` when the flag is not there or the endpoint cannot be written as one word."""
    flag_endpoint(text)
    if not endpoint or any(c.isspace() or c in "\"'\\$`" for c in endpoint):
        raise SwitchError(f"the endpoint {endpoint!r} cannot be written as one flag value")
    new = _FLAG.sub(lambda m: f"--container-runtime-endpoint{m.group(1)}{endpoint}", text)
    _verify_flags(text, new, endpoint)
    return new


def _verify_flags(before: str, text: str, endpoint: str | None) -> None:
    """``text`` is ``before`` with only the flag's values changed, all to ``endpoint``."""
    if _FLAG.sub("", text) != _FLAG.sub("", before) or flag_endpoint(text) != endpoint:
        raise SwitchError("cannot change only --container-runtime-endpoint in this file exactly; nothing written")


# ---- files -------------------------------------------------------------------------------------


def _write_atomically(path: Path, text: str) -> None:
    """Replace the file at ``path`` (a real path, not a symlink) with ``text``: a temporary file
    in the same directory with the old file's mode and owner, synced, then renamed over it."""
    st = path.stat()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, st.st_mode & 0o7777)
        if os.geteuid() == 0:
            os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class KubeletFile:
    path: Path
    kind: str  # "config" or "flags"

    @property
    def backup(self) -> Path:
        return self.path.with_name(self.path.name + BACKUP_SUFFIX)

    @property
    def target(self) -> Path:
        """Where the file really is: a symlink is edited at its target and kept."""
        return Path(os.path.realpath(self.path))

    def what(self) -> str:
        return KEY if self.kind == "config" else "--container-runtime-endpoint"

    def endpoint_in(self, text: str) -> str | None:
        return config_endpoint(text) if self.kind == "config" else flag_endpoint(text)

    def edit(self, text: str, endpoint: str | None) -> str:
        if self.kind == "config":
            return set_config_endpoint(text, endpoint)
        if endpoint is None:
            raise SwitchError("a flags file always names the endpoint")
        return set_flag_endpoint(text, endpoint)

    def changed(self, endpoint: str | None) -> tuple[str, str]:
        """(current text, text naming ``endpoint``)."""
        text = _read(self.path)
        try:
            return text, self.edit(text, endpoint)
        except SwitchError as exc:
            raise SwitchError(f"{self.path}: {exc}") from None

    def verify(self, old: str, new: str, endpoint: str | None) -> None:
        """``new`` parses as ``old`` with only the endpoint set to ``endpoint``."""
        if self.kind == "config":
            _verify_config(_parse_config(old), new, endpoint)
        else:
            _verify_flags(old, new, endpoint)

    def write(self, old: str, new: str, endpoint: str | None) -> None:
        """Write ``new`` (made from ``old`` by ``edit``), then read the file back, parse it and
        check again that only the endpoint changed."""
        _write_atomically(self.target, new)
        try:
            self.verify(old, _read(self.path), endpoint)
        except SwitchError as exc:
            raise SwitchError(f"{self.path}: read back after writing: {exc}") from None


Plan = tuple[KubeletFile, str, str]


def _write_all(plans: Sequence[Plan], endpoint_of: Callable[[KubeletFile], str | None]) -> None:
    """Write every changed file; when one fails, those already written get their old text back
    and ``SwitchError`` says so."""
    written: list[tuple[KubeletFile, str]] = []
    for f, old, new in plans:
        if old == new:
            continue
        try:
            f.write(old, new, endpoint_of(f))
            written.append((f, old))
        except (OSError, SwitchError) as exc:
            restored = []
            for done, text in [*reversed(written), (f, old)]:
                with contextlib.suppress(OSError, SwitchError):
                    if _read(done.path) != text:
                        _write_atomically(done.target, text)
                        restored.append(str(done.path))
            why = str(exc) if isinstance(exc, SwitchError) else f"{f.path}: cannot write: {exc}"
            raise SwitchError(why + (f"; restored {', '.join(restored)}" if restored else "")) from None


def _ready(url: str, timeout: float = 3.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200, f"{resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{exc.code}: {exc.read(200).decode('utf-8', 'replace').strip()}"
    except (OSError, ValueError) as exc:
        return False, str(getattr(exc, "reason", None) or exc)


def _restart(command: str | None, say: Callable[[str], None]) -> bool:
    if command is None:
        say("kubelet not restarted (--no-restart)")
        return True
    done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        say(f"restart command {command!r} failed with exit code {done.returncode}: "
            f"{' '.join(done.stderr.split())[:200]}")
        return False
    say(f"kubelet restarted ({command})")
    return True


def switch(files: Sequence[KubeletFile], endpoint: str, *, restart: str | None, preview: bool,
           say: Callable[[str], None]) -> int:
    """Write ``endpoint`` into ``files`` (backups first), restart, restore on a failed restart."""
    plans = [(f, *f.changed(endpoint)) for f in files]
    if preview:
        for f, old, new in plans:
            say(f"{f.path}: would {'change' if old != new else 'keep'} the endpoint ({endpoint})")
        return 0
    made: list[Path] = []
    try:
        for f, old, _new in plans:
            if not f.backup.exists():
                _write_new(f.backup, old, f.target)
                made.append(f.backup)
        _write_all(plans, lambda f: endpoint)
    except (OSError, SwitchError):
        for backup in made:
            backup.unlink(missing_ok=True)
        raise
    for f, _old, _new in plans:
        if f.backup in made:
            say(f"{f.path}: backed up to {f.backup}")
        say(f"{f.path}: {f.what()} is {endpoint}")
    if _restart(restart, say):
        return 0
    for f, old, new in plans:
        if old != new:
            _write_atomically(f.target, old)
        say(f"{f.path}: restored")
    _restart(restart, say)
    return 1


def _write_new(path: Path, text: str, like: Path) -> None:
    """Create ``path`` (it must not exist) holding ``text``, with the mode of ``like``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(path, like.stat().st_mode & 0o7777)


def rollback(files: Sequence[KubeletFile], endpoint: str, *, restart: str | None, preview: bool,
             say: Callable[[str], None]) -> int:
    """Set each file's endpoint back to the one its backup holds (``endpoint`` where there is no
    backup), changing nothing else, drop the backups and restart."""
    wanted: dict[Path, str | None] = {}
    plans: list[Plan] = []
    for f in files:
        if f.backup.exists() or f.backup.is_symlink():
            backup = _read(f.backup)
            try:
                wanted[f.path] = f.endpoint_in(backup)
            except SwitchError as exc:
                raise SwitchError(f"{f.backup}: {exc}") from None
        else:
            wanted[f.path] = endpoint
        plans.append((f, *f.changed(wanted[f.path])))
    for f, old, new in plans:
        source = f"as in {f.backup}" if f.backup.exists() else "no backup found"
        value = wanted[f.path] if wanted[f.path] is not None else "absent"
        verb = ("would change" if old != new else "would keep") if preview else ("set" if old != new else "kept")
        say(f"{f.path}: {f.what()} {verb}: {value} ({source})")
    if preview:
        return 0
    _write_all(plans, lambda f: wanted[f.path])
    for f in files:
        f.backup.unlink(missing_ok=True)
    return 0 if _restart(restart, say) else 1


def _same_endpoint(a: str | None, b: str) -> bool:
    """Whether two endpoints name the same socket (``/var/run`` is ``/run``)."""
    def norm(e: str) -> str:
        e = e.strip()
        e = e[len("unix://"):] if e.startswith("unix://") else e
        return "/run/" + e[len("/var/run/"):] if e.startswith("/var/run/") else e

    return a is not None and norm(a) == norm(b)


def on_proxy(files: Sequence[KubeletFile], proxy: str, say: Callable[[str], None]) -> list[KubeletFile]:
    """Those of ``files`` that exist and name ``proxy`` as kubelet's runtime endpoint."""
    out: list[KubeletFile] = []
    for f in files:
        if not f.path.exists() and not f.path.is_symlink():
            say(f"{f.path}: not there")
            continue
        text = _read(f.path)
        try:
            endpoint = f.endpoint_in(text)
        except SwitchError as exc:
            if f.kind == "flags" and not _FLAG.search(text):
                say(f"{f.path}: names no endpoint")
                continue
            raise SwitchError(f"{f.path}: {exc}") from None
        if _same_endpoint(endpoint, proxy):
            out.append(f)
        else:
            say(f"{f.path}: {f.what()} is {endpoint or 'unset'}, not the proxy: left alone")
    return out


def rollback_if_on_proxy(files: Sequence[KubeletFile], endpoint: str, proxy: str, *, restart: str | None,
                         preview: bool, say: Callable[[str], None]) -> int:
    """``rollback`` of the files naming ``proxy``; on a failed restart they name the proxy again
    (kubelet still runs on it) with their backups, and the result is 1."""
    chosen = on_proxy(files, proxy, say)
    if not chosen:
        say("kubelet does not point at the proxy: nothing to switch back")
        return 0
    if preview:
        return rollback(chosen, endpoint, restart=restart, preview=True, say=say)
    before = {f.path: (_read(f.path), _read(f.backup) if f.backup.exists() else None) for f in chosen}
    if rollback(chosen, endpoint, restart=restart, preview=False, say=say) == 0:
        return 0
    for f in chosen:
        text, backup = before[f.path]
        if backup is not None and not f.backup.exists():
            _write_new(f.backup, backup, f.target)
        _write_atomically(f.target, text)
        say(f"{f.path}: restored (kubelet was not restarted, so it still runs on the proxy)")
    return 1


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("kubelet-switch", help=HELP["kubelet-switch"],
                       description="Switch kubelet's container runtime endpoint to the proxy when doctor passes and "
                                   "/readyz is ready, keeping a backup; --to containerd rolls back. See "
                                   "packaging/kubelet.md.",
                       epilog=EXIT_CODES)
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``runtime-proxy kubelet-switch``: its own and doctor's (``runtime_proxy.commands.doctor``)."""
    own = p.add_argument_group("kubelet")
    own.add_argument("--to", choices=("proxy", "containerd"), required=True,
                     help="proxy: switch to the proxy (after doctor and /readyz); containerd: roll back")
    own.add_argument("--kubelet-config", action="append", default=[], metavar="FILE",
                     help="a KubeletConfiguration file whose containerRuntimeEndpoint is set (repeatable)")
    own.add_argument("--flags-file", action="append", default=[], metavar="FILE",
                     help="a file with --container-runtime-endpoint, e.g. kubeadm-flags.env (repeatable)")
    own.add_argument("--proxy-endpoint", default=PROXY_ENDPOINT, help="default %(default)s")
    own.add_argument("--containerd-endpoint", default=CONTAINERD_ENDPOINT,
                     help="written on rollback when a file has no backup (default %(default)s)")
    own.add_argument("--readyz", default="http://127.0.0.1:9464/readyz",
                     help="the proxy's readiness URL (its --metrics-addr; default %(default)s)")
    own.add_argument("--restart-command", default="systemctl restart kubelet",
                     help="how kubelet is restarted (default: %(default)s)")
    own.add_argument("--no-restart", action="store_true", help="edit the files only")
    own.add_argument("--dry-run", dest="preview", action="store_true",
                     help="say what would change; write and restart nothing")
    own.add_argument("--if-on-proxy", action="store_true",
                     help="with --to containerd: only the files that name the proxy's endpoint (missing files "
                          "and files naming anything else are left alone; none: exit 0, no restart); a failed "
                          "restart puts them back as they were and exits 1 (the package's prerm runs this)")
    checks = p.add_argument_group("doctor (checked before switching to the proxy)")
    doctor.add_arguments(checks)


def main_from_args(args: argparse.Namespace) -> int:
    def say(line: str) -> None:
        print(f"kubelet-switch: {line}", flush=True)

    files = [KubeletFile(Path(p), "config") for p in args.kubelet_config]
    files += [KubeletFile(Path(p), "flags") for p in args.flags_file]
    if not files:
        print("runtime-proxy kubelet-switch: give --kubelet-config FILE and/or --flags-file FILE", file=sys.stderr)
        return 2
    restart = None if args.no_restart else args.restart_command
    try:
        if args.to == "containerd" and args.if_on_proxy:
            return rollback_if_on_proxy(files, args.containerd_endpoint, args.proxy_endpoint, restart=restart,
                                        preview=args.preview, say=say)
        if args.to == "containerd":
            return rollback(files, args.containerd_endpoint, restart=restart, preview=args.preview, say=say)
        if args.if_on_proxy:
            print("runtime-proxy kubelet-switch: --if-on-proxy goes with --to containerd", file=sys.stderr)
            return 2
        for f in files:
            f.changed(args.proxy_endpoint)  # every file must be usable before anything is checked
        checks = doctor.run(doctor.options_from_args(args))
        failed = [c for c in checks if c.status == "fail"]
        if failed:
            for c in failed:
                say(f"doctor: {c.name}: {c.detail}")
            say("not switched: doctor failed")
            return 1
        say(f"doctor passed ({len(checks)} checks)")
        ready, why = _ready(args.readyz)
        if not ready:
            say(f"not switched: {args.readyz} is not ready ({why})")
            return 1
        say(f"{args.readyz}: ready")
        return switch(files, args.proxy_endpoint, restart=restart, preview=args.preview, say=say)
    except SwitchError as exc:
        print(f"runtime-proxy kubelet-switch: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"runtime-proxy kubelet-switch: {exc}", file=sys.stderr)
        return 2
