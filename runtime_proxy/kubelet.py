"""``runtime-proxy kubelet-switch``: point kubelet at the proxy, or back at containerd.

kubelet names its runtime in its config file (``KubeletConfiguration``'s
``containerRuntimeEndpoint``) and/or with the ``--container-runtime-endpoint`` flag in a flags
file (kubeadm's ``/var/lib/kubelet/kubeadm-flags.env`` or a systemd drop-in). ``switch`` edits
exactly that value in each file given, as text, so comments and every other setting stay as
they are; it writes each file atomically and keeps the file as it was before the first switch
in ``FILE.rhp-backup``.

Switching to the proxy happens only when ``runtime-proxy doctor`` passes (``runtime_proxy.doctor``,
the same flags) and the proxy's ``/readyz`` answers 200; then kubelet is restarted with the
restart command (``systemctl restart kubelet`` by default; a test gives its own or
``--no-restart``). If the restart fails, the files are restored and kubelet restarted again.
``--to containerd`` restores the backups (or writes the containerd endpoint when there is none)
and restarts kubelet, with no checks: rolling back must always be possible.
"""

from __future__ import annotations

import argparse
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
from runtime_proxy import doctor

__all__ = ["EXIT_CODES", "SwitchError", "add_arguments", "main_from_args", "set_config_endpoint",
           "set_flag_endpoint"]

PROXY_ENDPOINT = "unix:///var/run/koord-runtimeproxy/runtimeproxy.sock"
CONTAINERD_ENDPOINT = "unix:///run/containerd/containerd.sock"
BACKUP_SUFFIX = ".rhp-backup"
MAX_FILE_BYTES = 1 << 20
EXIT_CODES = """\
exit codes:
  0  kubelet's files name the wanted endpoint (and kubelet was restarted unless --no-restart)
  1  refused or failed: doctor failed, /readyz is not 200, or the restart failed (the files were
     restored and kubelet restarted on its old endpoint)
  2  bad command line, or a kubelet file that cannot be read, parsed or written
"""

_CONFIG_KEY = re.compile(r"^containerRuntimeEndpoint[ \t]*:[^\n]*$", re.M)
_FLAG = re.compile(r"--container-runtime-endpoint(=|[ \t]+)(\"[^\"\n]*\"|'[^'\n]*'|[^\s\"']+)")


class SwitchError(Exception):
    """A kubelet file cannot be used (exit 2); the message names it."""


def _read(path: Path) -> str:
    """A kubelet file's text, by the one reader of configured files (``rhp_ops.files``)."""
    try:
        return read_text_file(path, limit=MAX_FILE_BYTES)
    except FileRefused as exc:
        raise SwitchError(f"{path}: {exc.message}") from None


def set_config_endpoint(text: str, endpoint: str) -> str:
    """``text`` (a KubeletConfiguration in YAML) with ``containerRuntimeEndpoint`` set to
    ``endpoint``: the top-level line replaced, or added at the end. Raises ``SwitchError`` when
    the text is not a YAML mapping."""
    try:
        doc = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise SwitchError(f"not YAML: {' '.join(str(exc).split())[:200]}") from exc
    except RecursionError as exc:
        raise SwitchError("nested too deeply") from exc
    if not isinstance(doc, dict):
        raise SwitchError("not a KubeletConfiguration mapping")
    if doc.get("kind", "KubeletConfiguration") != "KubeletConfiguration":
        raise SwitchError(f"kind is {doc.get('kind')!r}, not KubeletConfiguration")
    line = f"containerRuntimeEndpoint: {endpoint}"
    if _CONFIG_KEY.search(text):
        return _CONFIG_KEY.sub(line, text, count=1)
    return text + ("" if not text or text.endswith("\n") else "\n") + line + "\n"


def set_flag_endpoint(text: str, endpoint: str) -> str:
    """``text`` (a flags file) with every ``--container-runtime-endpoint`` value replaced by
    ``endpoint``. Raises ``SwitchError`` when the flag is not there."""
    if not _FLAG.search(text):
        raise SwitchError("has no --container-runtime-endpoint flag to change")
    return _FLAG.sub(lambda m: f"--container-runtime-endpoint{m.group(1)}{endpoint}", text)


def _write_atomically(path: Path, text: str) -> None:
    st = path.stat()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, st.st_mode & 0o7777)
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

    def changed(self, endpoint: str) -> tuple[str, str]:
        """(current text, text naming ``endpoint``)."""
        text = _read(self.path)
        try:
            new = set_config_endpoint(text, endpoint) if self.kind == "config" else set_flag_endpoint(text, endpoint)
        except SwitchError as exc:
            raise SwitchError(f"{self.path}: {exc}") from exc
        return text, new


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


def switch(files: Sequence[KubeletFile], endpoint: str, *, restart: str | None, dry_run: bool,
           say: Callable[[str], None]) -> int:
    """Write ``endpoint`` into ``files`` (backups first), restart, restore on a failed restart."""
    plans = [(f, *f.changed(endpoint)) for f in files]
    if dry_run:
        for f, old, new in plans:
            say(f"{f.path}: would {'change' if old != new else 'keep'} the endpoint ({endpoint})")
        return 0
    for f, old, new in plans:
        if not f.backup.exists():
            f.backup.write_text(old, encoding="utf-8")
            os.chmod(f.backup, f.path.stat().st_mode & 0o7777)
            say(f"{f.path}: backed up to {f.backup}")
        if old != new:
            _write_atomically(f.path, new)
        say(f"{f.path}: containerRuntimeEndpoint is {endpoint}" if f.kind == "config"
            else f"{f.path}: --container-runtime-endpoint is {endpoint}")
    if _restart(restart, say):
        return 0
    for f, old, _new in plans:
        _write_atomically(f.path, old)
        say(f"{f.path}: restored")
    _restart(restart, say)
    return 1


def rollback(files: Sequence[KubeletFile], endpoint: str, *, restart: str | None, dry_run: bool,
             say: Callable[[str], None]) -> int:
    """Restore each file's backup (or write ``endpoint`` where there is none) and restart."""
    for f in files:
        if f.backup.exists():
            if dry_run:
                say(f"{f.path}: would restore {f.backup}")
                continue
            _write_atomically(f.path, _read(f.backup))
            f.backup.unlink()
            say(f"{f.path}: restored from {f.backup}")
        else:
            old, new = f.changed(endpoint)
            if dry_run:
                say(f"{f.path}: would {'change' if old != new else 'keep'} the endpoint ({endpoint})")
                continue
            if old != new:
                _write_atomically(f.path, new)
            say(f"{f.path}: endpoint is {endpoint} (no backup found)")
    if dry_run:
        return 0
    return 0 if _restart(restart, say) else 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``runtime-proxy kubelet-switch``: its own and doctor's (``runtime_proxy.doctor``)."""
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
    own.add_argument("--dry-run", action="store_true", help="say what would change; write and restart nothing")
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
        if args.to == "containerd":
            return rollback(files, args.containerd_endpoint, restart=restart, dry_run=args.dry_run, say=say)
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
        return switch(files, args.proxy_endpoint, restart=restart, dry_run=args.dry_run, say=say)
    except SwitchError as exc:
        print(f"runtime-proxy kubelet-switch: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"runtime-proxy kubelet-switch: {exc}", file=sys.stderr)
        return 2
