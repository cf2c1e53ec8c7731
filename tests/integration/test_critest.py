"""critest, cri-tools' CRI validation suite, against a private containerd directly and through
``runtime-proxy serve`` with each transport: every spec must end the same way both ways.

The binary is built from ``devenv/critest/`` by ``scripts/build-critest.sh`` (``RHP_CRITEST``
names another one). Without it the tests skip, or fail when ``RHP_REQUIRE_CRITEST=1``
(``scripts/test.sh`` sets it).

Each run starts its own network namespace holding only ``lo`` (:class:`PrivateNetns`) and a fresh
private containerd inside it, whose CNI config puts pods on a bridge that exists only in that
namespace; critest and the proxy run there too (critest's exec and attach streams go to
containerd's stream server on that namespace's 127.0.0.1). Nothing in there has a route off the
machine, so an image pull or name lookup fails at once instead of sending a packet; the
containerd log is checked to hold no ``PullImage`` at all. Specs are skipped by
:data:`SKIPPED_SPECS`: always every network, port, DNS and hostname spec, and the specs whose
images exist only in a registry. Every other spec uses critest's default test image, which
``--test-images-file`` maps to our offline busybox image (:data:`rhp_devenv.image.DEFAULT_IMAGE`,
imported by :class:`PrivateContainerd`), so critest finds it with ImageStatus and never pulls it.

critest runs its specs one at a time (its default ``-parallel 1``; more needs the ginkgo CLI,
and spreads nothing on 2 shared cores: the long specs wait, they do not compute).

The proxy runs as users run it: every installed built-in plugin, no entry points, no hook servers.
A spec whose outcome (passed, skipped, or failed at which node and source line) differs between
the direct run and a proxied run is run again both ways (focused on those specs) before the test
fails, so a spec that flakes under load on both paths is not blamed on the proxy.

containerd versions: ``RHP_CRITEST_VERSIONS`` (comma-separated; default ``1.7,2.1``; a run on
1.6 takes about 100 s against about 65 s on the others). A version that is not installed skips,
or fails when it is in ``RHP_REQUIRE_CONTAINERD``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from rhp_devenv.containerd import PrivateContainerd, binaries_for
from rhp_devenv.image import DEFAULT_IMAGE
from rhp_devenv.netns import PrivateNetns, pod_network_conflist

from tests.integration.harness import REPO, ProxyProcess, required_versions

# Three runs of about 65 s each (100 s on containerd 1.6) in one test on a loaded machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

VERSIONS = [v.strip() for v in os.environ.get("RHP_CRITEST_VERSIONS", "1.7,2.1").split(",") if v.strip()]
TRANSPORTS = ("relay", "grpc")

SKIPPED_SPECS: tuple[tuple[str, str], ...] = (
    (r"[Nn]etwork", "network: pod networking, host network, the Networking and Multiple Containers specs"),
    (r"[Pp]ort ?[Ff]orward|[Pp]ort mapping|[Hh]ost ?[Pp]ort", "port forwarding and port mapping"),
    (r"DNS", "DNS"),
    (r"[Hh]ost ?name", "setting or reading the hostname"),
    (r"\[k8s\.io\] Image Manager ", "pulls test images from gcr.io and registry.k8s.io"),
    (r"\[k8s\.io\] Multiple Containers ", "httpd image from registry.k8s.io"),
    (r"HostPID|PodPID|ContainerPID", "nginx image from registry.k8s.io"),
    (r"SupplementalGroupsPolicy", "test-image-predefined-group from gcr.io"),
    (r"NoNewPrivs", "nonewprivs image from registry.k8s.io"),
)
"""(ginkgo ``-ginkgo.skip`` regular expression, why); critest itself also skips its benchmarks."""

NEVER_RUN = re.compile(r"(?i)network|port ?forward|port mapping|host ?port|dns|host ?name")
"""What must never run here, whatever :data:`SKIPPED_SPECS` says (checked on every report)."""

MUST_PASS_DIRECT = (
    "[k8s.io] PodSandbox runtime should support basic operations on PodSandbox runtime should support "
    "running PodSandbox [Conformance]",
    "[k8s.io] Container runtime should support basic operations on container runtime should support "
    "starting container [Conformance]",
    "[k8s.io] Container runtime should support log runtime should support reopening container log [Conformance]",
    "[k8s.io] Streaming runtime should support streaming interfaces runtime should support exec with "
    "tty=true and stdin=true [Conformance]",
    "[k8s.io] Streaming runtime should support streaming interfaces runtime should support attach [Conformance]",
    "[k8s.io] Container OOM runtime should output OOMKilled reason should terminate with exitCode 137 "
    "and reason OOMKilled",
)
"""Specs the direct run must pass: a broken environment must not make "identical" trivially true."""

_RUN_TIMEOUT = 420.0
_FAILURE_AT = re.compile(r"In \[([A-Za-z]+)\] at: (\S+?):(\d+)")
_GO_REGEX_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


@dataclass(frozen=True)
class CritestRun:
    """What one critest run reported: spec name -> outcome, and how long it took."""

    outcomes: dict[str, str]
    messages: dict[str, str]
    seconds: float
    log: Path

    def counts(self) -> dict[str, int]:
        """passed / skipped / failed counts (a failure's outcome is ``failed <node> <file>:<line>``)."""
        return dict(Counter(outcome.split()[0] for outcome in self.outcomes.values()))

    def summary(self) -> str:
        c = self.counts()
        return (f"{c.get('passed', 0)} passed, {c.get('skipped', 0)} skipped, {c.get('failed', 0)} failed "
                f"in {self.seconds:.1f}s")


def skip_regex() -> str:
    """The one ``-ginkgo.skip`` expression made of :data:`SKIPPED_SPECS`."""
    return "|".join(f"(?:{pattern})" for pattern, _ in SKIPPED_SPECS)


def go_regex_literal(text: str) -> str:
    """*text* as a Go (RE2) regular expression matching exactly that text."""
    return _GO_REGEX_SPECIAL.sub(r"\\\1", text)


def parse_junit(path: Path) -> dict[str, str]:
    """Spec name (ginkgo's full text) -> ``passed``, ``skipped`` or ``failed <node> <file>:<line>``.

    Only ``[It]`` entries are specs; the suite nodes ([BeforeSuite], [ReportAfterSuite]) are left
    out. The failure's node and source line identify how it failed without the run's random IDs.
    """
    return {name: outcome for name, (outcome, _) in _junit_cases(path).items()}


def failure_messages(path: Path) -> dict[str, str]:
    """Spec name -> the start of its failure message, for the specs that failed."""
    return {name: message for name, (outcome, message) in _junit_cases(path).items() if outcome.startswith("failed")}


def _junit_cases(path: Path) -> dict[str, tuple[str, str]]:
    cases: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("[It] "):
            continue
        status = case.get("status", "")
        if status in ("failed", "panicked", "interrupted", "timedout", "aborted"):
            text = ""
            for child in case:
                if child.tag in ("failure", "error"):
                    text = f"{child.get('message', '')}\n{child.text or ''}"
            found = _FAILURE_AT.search(text)
            where = f"{found.group(1)} {Path(found.group(2)).name}:{found.group(3)}" if found else "?"
            outcome = f"failed {status} {where}" if status != "failed" else f"failed {where}"
            cases[name[5:]] = (outcome, text.strip()[:400])
        else:
            cases[name[5:]] = (status, "")
    return cases


def find_critest() -> Path | None:
    """``RHP_CRITEST``, else where ``scripts/build-critest.sh`` puts it (None when not built)."""
    named = os.environ.get("RHP_CRITEST")
    if named:
        return Path(named)
    try:
        out = subprocess.run(["bash", str(REPO / "scripts" / "build-critest.sh"), "--print-path"],
                             capture_output=True, text=True, check=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    path = Path(out.stdout.strip())
    return path if os.access(path, os.X_OK) else None


@pytest.fixture(scope="module")
def critest() -> Path:
    """The critest binary (see the module docstring for skip and fail)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run containerd")
    path = find_critest()
    if path is None or not os.access(path, os.X_OK):
        reason = "critest is not built: run scripts/build-critest.sh (scripts/install-deps.sh does)"
        if os.environ.get("RHP_REQUIRE_CRITEST") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def need_version(version: str) -> None:
    missing = binaries_for(version).missing()
    if missing:
        reason = f"containerd {version} is not installed ({', '.join(map(str, missing))} missing)"
        if version in required_versions():
            pytest.fail(reason)
        pytest.skip(reason)


def run_critest(critest: Path, version: str, work: Path, transport: str | None,
                focus: list[str] | None = None) -> CritestRun:
    """critest against a fresh private containerd *version* in a fresh network namespace, through a
    ``runtime-proxy serve --transport`` *transport* child (None: directly); *focus*: only these specs."""
    work.mkdir(parents=True, exist_ok=True)
    images = work / "test-images.yaml"
    images.write_text(f"defaultTestContainerImage: {DEFAULT_IMAGE}\nwebServerTestImage: {DEFAULT_IMAGE}\n")
    junit, log = work / "junit.xml", work / "critest.log"
    with PrivateNetns() as netns, PrivateContainerd(
        version, netns=netns.path, cni_conflist=pod_network_conflist(work / "ipam")
    ) as ctrd:
        endpoint = str(ctrd.socket)
        proxy = None
        if transport is not None:
            endpoint = str(work / "proxy.sock")
            proxy = ProxyProcess(["--backend", str(ctrd.socket), "--transport", transport, "--no-entry-points",
                                  "--hook-server-dir", str(work / "hookserver.d"), "--grace", "2"],
                                 log=work / "proxy.log", wrapper=netns.command([])).start(endpoint)
        argv = [str(critest), f"--runtime-endpoint=unix://{endpoint}", f"--image-endpoint=unix://{endpoint}",
                f"--test-images-file={images}", "-ginkgo.no-color", "-ginkgo.v",
                f"-ginkgo.skip={skip_regex()}", f"-ginkgo.junit-report={junit}", "-ginkgo.timeout=6m"]
        argv += [f"-ginkgo.focus={go_regex_literal(name)}" for name in focus or ()]
        began = time.monotonic()
        try:
            with open(log, "wb") as out:
                subprocess.run(netns.command(argv), cwd=work, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=_RUN_TIMEOUT, check=False)
        finally:
            seconds = time.monotonic() - began
            if proxy is not None:
                proxy.terminate(timeout=20)
        shutil.copyfile(ctrd.log_path, work / "containerd.log")  # the work dir goes with the daemon
        pulls = [line for line in ctrd.log_path.read_text(errors="replace").splitlines() if "PullImage" in line]
    assert not pulls, f"containerd was asked to pull an image (see {log}): {pulls[:3]}"
    assert junit.exists(), f"critest wrote no report; its output: {log}"
    run = CritestRun(parse_junit(junit), failure_messages(junit), seconds, log)
    ran_forbidden = [name for name, outcome in run.outcomes.items()
                     if outcome != "skipped" and NEVER_RUN.search(name)]
    assert not ran_forbidden, f"network, port, DNS or hostname specs ran: {ran_forbidden}"
    return run


_DIRECT: dict[str, CritestRun] = {}


def direct_run(critest: Path, version: str, tmp_path_factory: pytest.TempPathFactory) -> CritestRun:
    """The direct run of *version*, made once per module and shared by the proxied tests."""
    if version not in _DIRECT:
        run = run_critest(critest, version, tmp_path_factory.mktemp(f"critest-direct-{version}"), None)
        print(f"critest direct, containerd {version}: {run.summary()}")
        _DIRECT[version] = run
    return _DIRECT[version]


def differences(direct: dict[str, str], proxied: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Spec -> (direct outcome, proxied outcome) where they differ (a missing spec is ``absent``)."""
    return {name: (direct.get(name, "absent"), proxied.get(name, "absent"))
            for name in sorted(direct.keys() | proxied.keys())
            if direct.get(name, "absent") != proxied.get(name, "absent")}


@pytest.mark.parametrize("version", VERSIONS)
def test_critest_direct_baseline(critest: Path, version: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The direct run passes the core specs (so the comparison below means something)."""
    need_version(version)
    run = direct_run(critest, version, tmp_path_factory)
    not_passed = {name: run.outcomes.get(name, "absent") for name in MUST_PASS_DIRECT
                  if run.outcomes.get(name) != "passed"}
    assert not not_passed, f"direct critest on containerd {version} ({run.log}): {not_passed}"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("version", VERSIONS)
def test_critest_same_through_proxy(critest: Path, version: str, transport: str, tmp_path: Path,
                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every spec ends the same way directly and through ``runtime-proxy serve --transport``."""
    need_version(version)
    direct = direct_run(critest, version, tmp_path_factory)
    proxied = run_critest(critest, version, tmp_path / "proxied", transport)
    print(f"critest {transport}, containerd {version}: {proxied.summary()} (direct: {direct.summary()})")
    diff = differences(direct.outcomes, proxied.outcomes)
    if diff:
        # Confirm before blaming the proxy: the same specs again, both ways, focused.
        print(f"critest {transport}, containerd {version}: differ at first, running again: {diff}; "
              f"proxied failures: {[proxied.messages.get(name, '') for name in diff]}")
        names = list(diff)
        again_direct = run_critest(critest, version, tmp_path / "direct-again", None, focus=names)
        again_proxied = run_critest(critest, version, tmp_path / "proxied-again", transport, focus=names)
        diff = differences({n: again_direct.outcomes.get(n, "absent") for n in names},
                           {n: again_proxied.outcomes.get(n, "absent") for n in names})
        # A spec that ended differently in the two direct runs is unstable without the proxy (the
        # OOM spec's reason, OOMKilled or Error, on a loaded machine): it says nothing of the proxy.
        unstable = {n for n in diff if direct.outcomes.get(n, "absent") != again_direct.outcomes.get(n, "absent")}
        if unstable:
            warnings.warn(f"critest {transport}, containerd {version}: specs unstable without the proxy "
                          f"(not compared): {sorted(unstable)}; logs under {tmp_path}", stacklevel=1)
            diff = {n: v for n, v in diff.items() if n not in unstable}
        failures = {name: (again_direct.messages.get(name, ""), again_proxied.messages.get(name, ""))
                    for name in diff}
        if not diff:
            warnings.warn(f"critest {transport}, containerd {version}: a first-run difference did not repeat: "
                          f"{names}; logs under {tmp_path}", stacklevel=1)
        assert not diff, (f"critest specs end differently through the {transport} proxy on containerd "
                          f"{version} (direct, proxied): {diff}; failure messages: {failures}; logs under {tmp_path}")


def test_critest_skips_every_network_port_dns_and_hostname_spec(critest: Path, tmp_path: Path) -> None:
    """A dry run lists every spec: each one about network, ports, DNS or the hostname is skipped,
    and so is each one that needs a registry image, while the rest still run."""
    junit = tmp_path / "dry.xml"
    subprocess.run([str(critest), "--runtime-endpoint=unix:///nonexistent", "-ginkgo.dry-run",
                    f"-ginkgo.skip={skip_regex()}", f"-ginkgo.junit-report={junit}"],
                   cwd=tmp_path, capture_output=True, stdin=subprocess.DEVNULL, timeout=60, check=False)
    outcomes = parse_junit(junit)
    would_run = {name for name, outcome in outcomes.items() if outcome != "skipped"}
    assert not {name for name in would_run if NEVER_RUN.search(name)}
    registry_specs = re.compile(r"Image Manager|Multiple Containers|HostPID|PodPID|ContainerPID|"
                                r"SupplementalGroupsPolicy|NoNewPrivs")
    assert not {name for name in would_run if registry_specs.search(name)}
    assert set(MUST_PASS_DIRECT) <= would_run
    assert len(would_run) >= 50, sorted(would_run)
