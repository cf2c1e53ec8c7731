"""The Debian 12 node package (``packaging/deb/build.sh``), installed on this machine the way the
README's "Install on a node" says, then upgraded, rolled back and purged.

Two packages are made in a temporary directory: the project's version by the build script (as
shipped), and a later version repacked from it with ``dpkg-deb`` (a second build would double the
test's time for no other difference). The life cycle runs with ``apt-get`` (which waits for
another dpkg run's lock) in one test, step by step:

- install: the files are in place, the conffiles are listed, postinst made the runtime directory
  and enabled the unit without starting it (systemd is not running here), and the installed
  ``runtime-proxy doctor`` passes against a private containerd, with RDT reported as a warning
  where resctrl is not mounted (as here); the installed ``runtime-proxy serve``, started with the
  unit's own command line on private paths, becomes ready and stops cleanly on SIGTERM; the venv
  holds the ``[cluster]`` extra (a config with ``fromCluster`` and ``report.enable`` passes the
  start-up checks) and ``--version`` names the commit the package was built from;
- upgrade to the later version and rollback to the first (the later one's extra file goes): the
  admin's edits to both conffiles are kept, silently (no ``.dpkg-*`` files), and the command runs
  after each;
- remove: refused while kubelet's config names the proxy's socket and kubelet cannot be switched
  back (the proxy keeps running); with a restart that works, the prerm switches kubelet's config
  back to containerd first, then the program and its venv go, the edited config stays;
- purge: nothing of the package is left (venv, config, unit, its enablement, runtime directory),
  and every path it touched is as before the test. ``/opt/runtime-hook-proxy/`` itself stays when
  ``scripts/install-deps.sh`` keeps containerd there.

It changes this machine as root, so it runs only when none of the package's paths exist before
(it skips, naming them, otherwise) and purges in any case at the end."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from rhp_devenv.containerd import PrivateContainerd

REPO = Path(__file__).resolve().parents[1]
PKG = "runtime-hook-proxy"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
SUFFIX = "+rhptest2"
MARKER = Path(f"/usr/share/doc/{PKG}/later-version")
UNIT = "runtime-proxy.service"
VENV = Path("/opt/runtime-hook-proxy/venv")
ETC = Path("/etc/runtime-hook-proxy")
RUNDIR = Path("/run/koord-runtimeproxy")
OURS = (VENV, ETC, RUNDIR, Path("/usr/bin/runtime-proxy"), Path(f"/lib/systemd/system/{UNIT}"),
        Path(f"/etc/systemd/system/{UNIT}"), Path(f"/etc/systemd/system/multi-user.target.wants/{UNIT}"),
        Path("/usr/lib/tmpfiles.d/runtime-hook-proxy.conf"), Path(f"/usr/share/doc/{PKG}"))
# Where the maintainer scripts and deb-systemd-helper write: compared before and after.
WATCHED = (Path("/etc/systemd/system"), Path("/var/lib/systemd/deb-systemd-helper-enabled"),
           Path("/var/lib/systemd/deb-systemd-helper-masked"), Path("/opt/runtime-hook-proxy"), Path("/etc"),
           Path("/run"), Path("/usr/bin"), Path("/var/lib/dpkg/info"))
APT = ["apt-get", "-y", "-q", "-o", "DPkg::Lock::Timeout=600", "-o", "APT::Sandbox::User=root"]
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}



def _why_not_here() -> str:
    release = Path("/etc/debian_version")
    if not release.exists() or not release.read_text().startswith("12"):
        return "not Debian 12"
    for tool in ("/usr/bin/python3", "/usr/bin/apt-get", "/usr/bin/dpkg-deb"):
        if not os.access(tool, os.X_OK):
            return f"{tool} is missing"
    present = [str(p) for p in OURS if os.path.lexists(p)]
    if present:
        return f"the package's paths exist already (left alone): {', '.join(present)}"
    if _known_to_dpkg():
        return f"{PKG} is known to dpkg already (left alone)"
    return ""


def _installed_version() -> str:
    """The version dpkg has installed ("" when none; a purged or removed package has none)."""
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", PKG], capture_output=True, text=True,
                          env=ENV, check=False)
    status, _, version = proc.stdout.rpartition(" ")
    return version if proc.returncode == 0 and status.endswith(" installed") else ""


def _known_to_dpkg() -> bool:
    """Installed, or removed with its config files kept."""
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", PKG], capture_output=True, text=True, env=ENV,
                          check=False)
    return proc.returncode == 0 and not proc.stdout.endswith("not-installed")


def _run(cmd: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**ENV, **env},
                          stdin=subprocess.DEVNULL, check=False)
    out = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"{shlex.join(cmd)}: exit {proc.returncode}\n{out}"
    return proc


def _snapshot() -> set[str]:
    """Every path of ours under WATCHED (names with runtime-proxy, runtime-hook-proxy or
    koord-runtimeproxy), and what /opt/runtime-hook-proxy holds."""
    names = ("runtime-proxy", "runtime-hook-proxy", "koord-runtimeproxy")
    seen: set[str] = set()
    for top in WATCHED:
        if not top.is_dir():
            continue
        if top == Path("/opt/runtime-hook-proxy"):
            seen |= {str(p) for p in top.iterdir()}
            continue
        deep = top not in (Path("/etc"), Path("/run"), Path("/usr/bin"), Path("/var/lib/dpkg/info"))
        entries = (Path(d, n) for d, dirs, files in os.walk(top) for n in (*dirs, *files)) if deep else top.iterdir()
        seen |= {str(p) for p in entries if any(n in p.name for n in names)}
    return seen


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The version -> .deb: the project's, built by packaging/deb/build.sh (the wheel cache is the
    default one, so a second run downloads nothing), and a later one made from it with dpkg-deb:
    its version gets SUFFIX and it holds one file more (MARKER), which a rollback must take away."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    why = _why_not_here()
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp("deb")
    out.chmod(0o755)
    proc = _run(["bash", str(REPO / "packaging/deb/build.sh")], RHP_DEB_OUT=str(out), HOME=os.environ.get("HOME", "/"))
    first = Path(proc.stdout.strip().splitlines()[-1])
    # a line per step with the elapsed time (the build took 73 s, silent, on the old main)
    steps = re.findall(r"^packaging/deb/build\.sh: \[ *\d+s\] (.*)$", proc.stderr, re.M)
    assert len(steps) >= 5 and steps[-1] == "done", proc.stderr[-3000:]
    assert first == out / f"{PKG}_{VERSION}_amd64.deb"
    tree = out / "tree"
    _run(["dpkg-deb", "-R", str(first), str(tree)])
    control = tree / "DEBIAN/control"
    control.write_text(control.read_text().replace(f"\nVersion: {VERSION}\n", f"\nVersion: {VERSION}{SUFFIX}\n"))
    (tree / str(MARKER).lstrip("/")).write_text("only in the later version\n")
    second = out / f"{PKG}_{VERSION}{SUFFIX}_amd64.deb"
    _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(tree), str(second)])
    assert f"Version: {VERSION}{SUFFIX}" in _run(["dpkg-deb", "-f", str(second)]).stdout
    return {VERSION: first, VERSION + SUFFIX: second}


@pytest.fixture()
def machine(debs: dict[str, Path]) -> Iterator[set[str]]:
    """What this machine holds of ours before the test; the package is purged afterwards whatever
    happened."""
    before = _snapshot()
    try:
        yield before
    finally:
        if _known_to_dpkg():
            subprocess.run([*APT, "purge", PKG], capture_output=True, env=ENV, stdin=subprocess.DEVNULL,
                           timeout=600, check=False)


def _doctor(backend: Path) -> tuple[int, dict[str, Any], dict[str, dict[str, str]]]:
    proc = subprocess.run(["/usr/bin/runtime-proxy", "doctor", "--config", str(ETC / "config.yaml"),
                           "--backend", str(backend), "-o", "json"],
                          capture_output=True, text=True, timeout=120, env=ENV, check=False)
    report = json.loads(proc.stdout)
    return proc.returncode, report, {c["check"]: c for c in report["checks"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve_from_the_unit(backend: Path, tmp: Path) -> None:
    """Start the installed proxy with the unit's ExecStart, on private paths, until /readyz says
    200; then SIGTERM and exit 0."""
    unit = Path(f"/lib/systemd/system/{UNIT}").read_text()
    line = unit.split("ExecStart=", 1)[1].split("\n# ", 1)[0].replace("\\\n", " ")
    argv = shlex.split(line)
    assert argv[:2] == ["/usr/bin/runtime-proxy", "serve"]
    port = _free_port()
    swap = {"--listen": str(tmp / "proxy.sock"), "--backend": str(backend), "--metrics-addr": f"127.0.0.1:{port}"}
    argv = [swap.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
    assert argv[argv.index("--config") + 1] == str(ETC / "config.yaml")
    log = (tmp / "serve.log").open("w")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=ENV, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"serve exited {proc.returncode}: {(tmp / 'serve.log').read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"not ready in 120 s: {(tmp / 'serve.log').read_text()[-3000:]}"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp / "serve.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def _install(deb: Path, *flags: str) -> str:
    proc = _run([*APT, "install", *flags, str(deb)])
    return proc.stdout + proc.stderr


def _edits_kept(edits: dict[Path, str]) -> None:
    for path, text in edits.items():
        assert path.read_text() == text, f"{path}: the admin's edit is gone"
    leftovers = sorted(p.name for p in ETC.iterdir() if ".dpkg-" in p.name or p.suffix in (".ucf-dist", ".orig"))
    assert leftovers == []


def _pins(name: str) -> dict[str, Requirement]:
    lines = (REPO / "packaging/deb" / name).read_text().splitlines()
    reqs = [Requirement(line.split(" --hash=")[0]) for line in lines if line and not line.startswith("#")]
    assert all(" --hash=sha256:" in line for line in lines if line and not line.startswith("#"))
    return {canonicalize_name(r.name): r for r in reqs}


def test_the_node_venv_pins_every_base_dependency_and_no_extra() -> None:
    pins = _pins("requirements.txt")
    for req in pins.values():
        assert str(req.specifier).startswith("=="), f"{req}: pin it with =="
    for dep in map(Requirement, PYPROJECT["project"]["dependencies"]):
        name = canonicalize_name(dep.name)
        assert name in pins, f"{dep.name} is a base dependency: pin it in packaging/deb/requirements.txt"
        pinned = next(iter(pins[name].specifier)).version
        assert dep.specifier.contains(pinned, prereleases=True), f"{name}=={pinned} is outside {dep.specifier}"
    extras = {canonicalize_name(Requirement(d).name) for k in ("cluster", "scheduler")
              for d in PYPROJECT["project"]["optional-dependencies"][k]}
    base = {canonicalize_name(Requirement(d).name) for d in PYPROJECT["project"]["dependencies"]}
    assert not set(pins) & (extras - base)


def test_the_wheel_is_built_with_pinned_build_requirements() -> None:
    pins = _pins("build-requirements.txt")
    for dep in map(Requirement, PYPROJECT["build-system"]["requires"]):
        name = canonicalize_name(dep.name)
        assert name in pins
        assert dep.specifier.contains(next(iter(pins[name].specifier)).version)


def test_the_unit_wants_containerd_without_requiring_it() -> None:
    """A containerd restart must not restart the proxy: Wants= and After=, never Requires=,
    BindsTo= or PartOf= (which propagate containerd's stop and restart)."""
    directives = [line for line in (REPO / "packaging/runtime-proxy.service").read_text().splitlines()
                  if line and not line.startswith("#")]
    assert {"After=containerd.service", "Wants=containerd.service"} <= set(directives)
    assert [line for line in directives if line.startswith(("Requires=", "BindsTo=", "PartOf="))] == []
    exec_start = next(line for line in directives if line.startswith("ExecStart="))
    assert exec_start.startswith("ExecStart=/usr/bin/runtime-proxy serve")


def test_readme_shows_the_commands_this_test_runs() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Install on a node", 1)[1].split("\n## ", 1)[0]
    for command in ("bash packaging/deb/build.sh", f"apt-get install ./dist/{PKG}_{VERSION}_amd64.deb",
                    "runtime-proxy doctor --config /etc/runtime-hook-proxy/config.yaml",
                    f"apt-get install --allow-downgrades ./dist/{PKG}_", f"apt-get purge {PKG}"):
        assert command in section, command


def test_the_node_venv_holds_the_cluster_extra() -> None:
    """Every documented node config works from the package: the build installs the [cluster]
    extra's pins (on the old main it left them out and report.enable made serve exit 2)."""
    build = (REPO / "packaging/deb/build.sh").read_text()
    assert "packaging/image/requirements-cluster.txt" in build
    lines = (REPO / "packaging/image/requirements-cluster.txt").read_text().splitlines()
    pinned = {canonicalize_name(Requirement(line.split(" --hash=")[0]).name) for line in lines
              if line and not line.startswith("#")}
    for dep in map(Requirement, PYPROJECT["project"]["optional-dependencies"]["cluster"]):
        assert canonicalize_name(dep.name) in pinned


def test_prerm_guards_kubelet_before_it_stops_the_proxy() -> None:
    prerm = (REPO / "packaging/deb/prerm").read_text()
    guard = prerm.index("kubelet-switch --to containerd --if-on-proxy")
    assert guard < prerm.index('deb-systemd-invoke stop "$UNIT"')
    assert "exit 1" in prerm[guard:prerm.index('deb-systemd-invoke stop "$UNIT"')]


def _kubelet_on_the_proxy(tmp: Path) -> Path:
    config = tmp / "kubelet" / "config.yaml"
    config.parent.mkdir()
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                      "containerRuntimeEndpoint: unix:///var/run/koord-runtimeproxy/runtimeproxy.sock\n")
    return config


def _cluster_configs_are_usable(tmp: Path) -> None:
    """fromCluster and report.enable pass the installed proxy's start-up checks."""
    node = tmp / "cluster-node.yaml"
    node.write_text("nodeSLO: {}\n")
    config = tmp / "cluster-config.yaml"
    config.write_text(f"nodeConfigFile: {node}\nfromCluster: true\nreport:\n  enable: true\n")
    check = ("from runtime_proxy.config import check_usable, load_config; "
             f"check_usable(load_config({str(config)!r})); print('usable')")
    assert _run([str(VENV / "bin/python3"), "-c", check]).stdout.strip() == "usable"


@pytest.mark.slow
@pytest.mark.requires_root
@pytest.mark.timeout(900)
def test_install_start_upgrade_rollback_purge(debs: dict[str, Path], machine: set[str], tmp_path: Path) -> None:
    # install
    said = _install(debs[VERSION])
    assert _installed_version() == VERSION
    # No systemd here: enabled (below), not started.
    assert f"systemd is not running: {UNIT} is enabled, not started" in said
    assert not (RUNDIR / "runtimeproxy.sock").exists()
    conffiles = _run(["dpkg-query", "-W", "-f=${Conffiles}", PKG]).stdout.split()
    assert {str(ETC / "config.yaml"), str(ETC / "node.yaml")} <= set(conffiles)
    assert os.path.realpath("/usr/bin/runtime-proxy") == str(VENV / "bin/runtime-proxy")
    assert os.readlink(VENV / "bin/python3") == "/usr/bin/python3"
    assert (RUNDIR.stat().st_mode & 0o777) == 0o755
    directives = [line for line in Path(f"/lib/systemd/system/{UNIT}").read_text().splitlines()
                  if not line.startswith("#")]
    assert {"After=containerd.service", "Wants=containerd.service"} <= set(directives)
    assert not [line for line in directives if line.startswith(("Requires=", "BindsTo=", "PartOf="))]
    wants = Path(f"/etc/systemd/system/multi-user.target.wants/{UNIT}")
    assert wants.resolve() == Path(f"/lib/systemd/system/{UNIT}").resolve()
    site = VENV / "lib/python3.11/site-packages"
    dists = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    assert {"runtime_hook_proxy", "kubernetes"} <= dists  # the [cluster] extra
    extra = PYPROJECT["project"]["optional-dependencies"]
    scheduler_only = ({canonicalize_name(Requirement(d).name) for d in extra["scheduler"]}
                      - {canonicalize_name(Requirement(d).name) for d in extra["cluster"]})
    assert not {d.replace("_", "-") for d in dists} & (scheduler_only | {"pip", "setuptools"})  # no [scheduler]
    said = _run(["/usr/bin/runtime-proxy", "--version"]).stdout
    assert said.startswith(f"runtime-proxy {VERSION} ")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode == 0:
        assert said.rstrip().endswith(f", commit {head.stdout.strip()[:12]})"), said
    _cluster_configs_are_usable(tmp_path)

    ctrd = PrivateContainerd("1.6", load_image=False).start()
    try:
        rc, report, checks = _doctor(ctrd.socket)
        failed = {name: c["detail"] for name, c in checks.items() if c["status"] == "fail"}
        assert failed == {}
        assert rc == 0 and report["ready"] is True
        # RDT absent (no resctrl mounted, as here): a warning (rdt skipped), not a failure.
        resctrl = any(line.split()[2:3] == ["resctrl"] for line in Path("/proc/mounts").read_text().splitlines())
        assert checks["resctrl"]["status"] == ("ok" if resctrl else "warn"), checks["resctrl"]
        assert checks["containerd (CRI)"]["status"] == "ok"
        assert checks["config"]["status"] == "ok" and checks["node config"]["status"] == "ok"
        _serve_from_the_unit(ctrd.socket, tmp_path)
    finally:
        ctrd.stop()

    # the admin edits both conffiles
    edits = {ETC / "config.yaml": (ETC / "config.yaml").read_text() + "# edited by the admin\n",
             ETC / "node.yaml": "# this node\nnodeSLO: {}\n"}
    for path, text in edits.items():
        path.write_text(text)

    # upgrade
    _install(debs[VERSION + SUFFIX])
    assert _installed_version() == VERSION + SUFFIX
    _edits_kept(edits)
    assert MARKER.exists()
    _run(["/usr/bin/runtime-proxy", "--version"])

    # rollback
    _install(debs[VERSION], "--allow-downgrades")
    assert _installed_version() == VERSION
    _edits_kept(edits)
    assert not MARKER.exists()
    _run(["/usr/bin/runtime-proxy", "plan", "--help"])

    # remove: not while kubelet points at the proxy and cannot be switched back
    kubelet = _kubelet_on_the_proxy(tmp_path)
    guard = {"RHP_KUBELET_CONFIG": str(kubelet), "RHP_KUBELET_FLAGS_FILE": ""}
    refused = subprocess.run([*APT, "remove", PKG], capture_output=True, text=True, timeout=600,
                             stdin=subprocess.DEVNULL, env={**ENV, **guard, "RHP_KUBELET_RESTART": "false"},
                             check=False)
    assert refused.returncode != 0
    assert "not removed: kubelet points at the proxy's socket" in refused.stdout + refused.stderr
    assert _installed_version() == VERSION and os.path.lexists("/usr/bin/runtime-proxy")
    assert "runtimeproxy.sock" in kubelet.read_text()
    # with a restart that works, prerm switches kubelet back first; the program goes, the config stays
    restarted = tmp_path / "kubelet-restarted"
    _run([*APT, "remove", PKG], **guard, RHP_KUBELET_RESTART=f"touch {restarted}")
    assert restarted.exists()
    assert "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock" in kubelet.read_text()
    assert _installed_version() == "" and _known_to_dpkg()
    assert not os.path.lexists("/usr/bin/runtime-proxy") and not VENV.exists()
    _edits_kept(edits)

    # purge
    _run([*APT, "purge", PKG])
    assert not _known_to_dpkg()
    assert _installed_version() == ""
    left = [str(p) for p in OURS if os.path.lexists(p)]
    assert left == []
    assert _snapshot() == machine
