"""The ``runtime-proxy`` sub-commands, one module each; ``main`` is the dispatcher and
``runtime_proxy.compose`` builds what they run."""
