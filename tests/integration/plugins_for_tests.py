"""Plugins used by the integration tests: each is a tiny module-like class of hookimpls."""

from __future__ import annotations

import json
import os
import time

from hooks import ContainerFacts, NodeFacts, Plan, PodFacts, hookimpl


class PinPlugin:
    """Sets cpuset_cpus "0" and cpu_shares 777 on every container of pods labelled test=pin."""

    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts, container: ContainerFacts) -> Plan | None:
        if pod.labels.get("test") != "pin":
            return None
        return Plan().set_resource("cpuset_cpus", "0").set_resource("cpu_shares", 777)

    @hookimpl
    def rhp_pre_update_container_resources(self, pod: PodFacts, container: ContainerFacts) -> Plan | None:
        if pod.labels.get("test") != "pin":
            return None
        return Plan().set_resource("cpu_shares", 555)


class RaisingPlugin:
    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts) -> Plan | None:
        if pod.labels.get("test") == "fault":
            raise RuntimeError("boom from test plugin")
        return None


class SleepingPlugin:
    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts) -> Plan | None:
        if pod.labels.get("test") == "fault":
            time.sleep(3)
        return None


class GarbagePlugin:
    @hookimpl
    def rhp_pre_create_container(self, pod: PodFacts) -> object:
        if pod.labels.get("test") == "fault":
            return {"cpuset_cpus": "0"}
        return None


class RecordingPlugin:
    """Appends the context of every UpdateContainerResources hook to $RHP_RECORD as JSON lines."""

    @hookimpl
    def rhp_pre_update_container_resources(self, pod: PodFacts, container: ContainerFacts, node: NodeFacts) -> None:
        path = os.environ.get("RHP_RECORD")
        if not path:
            return None
        record = {
            "pod": {
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
                "labels": dict(pod.labels),
                "annotations": dict(pod.annotations),
                "cgroup_parent": pod.cgroup_parent,
                "sandbox_id": pod.sandbox_id,
            },
            "container": {
                "name": container.name,
                "id": container.id,
                "labels": dict(container.labels),
                "annotations": dict(container.annotations),
                "resources": container.resources.to_dict(),
                "envs": dict(container.envs),
            },
        }
        with open(path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")
        return None


# Module-level instance so the proxy can load this module by name (config ``pluginModules``).
recording = RecordingPlugin()
rhp_pre_update_container_resources = recording.rhp_pre_update_container_resources
