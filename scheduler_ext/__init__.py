"""Kubernetes scheduler extender: exact CPU, NUMA and GPU allocation in Koordinator's formats.

Layers, outermost first: ``cli`` (wiring) -> ``server`` (HTTP) -> ``extender`` (decisions and
the bind shell) -> ``state`` (cache), ``ledger`` (HA) and ``kube`` (the only API client user)
-> ``allocator``, ``annotations``, ``pods``, ``topology``, ``quantity`` (pure values). See
``scheduler_ext/README.md``.
"""
