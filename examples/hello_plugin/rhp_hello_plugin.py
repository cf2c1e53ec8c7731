"""rhp_hello_plugin: an example third-party plugin for runtime-hook-proxy.

Stages: PreCreateContainer.
Inputs: pod label ``example.com/hello: "true"``; pod name and namespace.
Outputs: container env ``HELLO_FROM=<namespace>/<name>`` and container annotation
``example.com/greeted: "true"``.
Leaves alone: every other pod, and every resource field.
"""

from __future__ import annotations

from hooks import ContainerFacts, Plan, PodFacts, hookimpl

LABEL = "example.com/hello"


@hookimpl
def rhp_pre_create_container(pod: PodFacts, container: ContainerFacts) -> Plan | None:
    """Greet containers of pods that ask for it; say nothing about the others."""
    if pod.labels.get(LABEL) != "true":
        return None
    return (
        Plan()
        .set_env("HELLO_FROM", f"{pod.namespace}/{pod.name}")
        .set_annotation("example.com/greeted", "true")
    )
