"""host_app_qos: QoS for applications that run on the host, outside containers.

Stages
    ``reconcile_node`` (at proxy start, on every node config change and every period).
Inputs
    NodeSLO ``hostApplications[]``: ``name``, ``qos`` (LSE/LSR/LS/BE/SYSTEM), ``priority``,
    ``cgroupPath{base (CgroupRoot | Kubepods | KubepodsBurstable | KubepodsBesteffort),
    parentDir, relativePath}`` (default ``host-latency-sensitive/<name>`` for LSE/LSR/LS,
    ``host-best-effort/<name>`` for BE); the group identity config (same keys and defaults as
    plugin ``group_identity``); the LS share pools (as plugin ``cpuset``).
Outputs
    writes ``host-app``/``<path>``: ``cpu.bvt_warp_ns`` by the app's QoS (0 while group
    identity is disabled; ``cpu.idle`` = schedIdle instead under ``cpuPolicy: coreSched``) and,
    for LS apps only, ``cpuset.cpus`` = all LS share pools.
Leaves alone
    creating the cgroups, initialising their cpuset.mems and moving PIDs in (the user's job, as
    in Koordinator); a path that would leave the cgroup root is refused (a skip), as is an app
    without a path; cpuset for non-LS apps is recorded as a skip (Koordinator treats it as an
    error).
"""

from __future__ import annotations

from hooks.facts import NodeFacts, all_share_pool_cpus, format_cpu_list, host_app_cgroup_path, share_pools
from hooks.plan import Plan
from hooks.spec import hookimpl
from koord_formats import keys


@hookimpl
def rhp_reconcile_node(node: NodeFacts) -> Plan | None:
    plan = Plan()
    problems: list[str] = []
    apps = node.rules.host_applications.read(problems)
    for problem in problems:
        plan.skip(problem)
    policy = node.rules.cpu_policy
    gi_enabled = node.rules.group_identity_enabled
    ls_cpus: str | None = None
    for app in apps:
        name, qos = app.name, app.qos
        try:
            path = host_app_cgroup_path(app, node.cgroup)
        except ValueError as exc:
            plan.skip(f"host application {name!r} refused: {exc}")
            continue
        if not path:
            plan.skip(f"host application {name!r} has no cgroup path (qos {qos!r})")
            continue
        key = keys.SLO_CLASS_KEYS.get(qos)
        if policy == keys.CPU_POLICY_CORE_SCHED:
            if key and node.rules.cpu_qos(key).enable:
                plan.write("host-app", path, "cpu.idle", 1 if node.rules.cpu_qos(key).sched_idle else 0)
        elif policy in ("", keys.CPU_POLICY_GROUP_IDENTITY):
            value = node.rules.class_bvt_value(key) if (gi_enabled and key) else 0
            plan.write("host-app", path, "cpu.bvt_warp_ns", value)
        if qos == keys.QOS_LS:
            if ls_cpus is None:
                try:
                    ls_cpus = format_cpu_list(all_share_pool_cpus(share_pools(node)))
                except ValueError as exc:
                    plan.skip(f"bad cpu share pools: {exc}")
                    ls_cpus = ""
            if ls_cpus:
                plan.write("host-app", path, "cpuset.cpus", ls_cpus)
        else:
            plan.skip(f"host application {name!r}: cpuset is only set for LS applications, not {qos!r}")
    return plan
