"""The hook server door: Koordinator's RuntimeHookService over the lifecycle core (``door.py``);
``runtime_proxy.commands.hook_server`` serves it (``runtime-proxy hook-server``)."""
