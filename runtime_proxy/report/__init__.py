"""The node agent's reports to the cluster, as koordlet makes them (``report.enable``):

- ``config``: the ``report`` section of the config file;
- ``sources``: NUMA memory and GPUs from sysfs and the NVIDIA driver's files, kubelet's config;
- ``build``: pure builders of the NodeResourceTopology and Device parts and their merge into
  what the API server holds;
- ``nodemetric``: the NodeMetric status from the usage sampler's samples (pure);
- ``writer``: the one writer (bounded GET, create, replace; rate limits);
- ``loop``: ``Reporter``, started by ``runtime_proxy.wiring.loops`` in every entry point.

Formats are ``koord_formats``' (``nrt``, ``device``, ``nodemetric``, ``topology``, ``node``).
"""
