"""The ``runtime-proxy`` sub-commands, one module each; ``main`` is the dispatcher and
``runtime_proxy.compose`` builds what they run.

``HELP`` is each sub-command's one line in ``runtime-proxy --help``, in the order it lists them:
its module's ``add_parser`` uses it, and the dispatcher lists the sub-commands that do not run
with it without importing their modules (``runtime_proxy.commands.main``)."""

HELP: dict[str, str] = {
    "serve": "run the CRI proxy",
    "plan": "print the plans for JSON documents (FILEs or stdin)",
    "doctor": "check that this node has what the proxy and its plugins need",
    "kubelet-switch": "point kubelet at the proxy (after doctor and /readyz) or back",
    "nri": "run the plugins as a containerd NRI plugin",
    "hook-server": "serve the plugins over Koordinator's RuntimeHookService",
}
