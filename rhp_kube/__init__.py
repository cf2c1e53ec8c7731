"""The one Kubernetes access layer the node agent, the extender and the manager share.

Credentials are loaded once (``rhp_kube.credentials``: in-cluster, kubeconfig, the documented
``--kubeconfig``/``--context``/``--in-cluster`` flags) and every watch of the cluster is one
supervised list-and-watch (``rhp_kube.watch``). Leader election and the Event recorder live here
too, beside them.

Sits above ``koord_formats``, ``rhp_ops`` and ``cri_protos`` (it may import them) and below
``runtime_proxy`` and ``scheduler_ext`` (it never imports them). The third-party libraries it
uses (``kubernetes`` for configuration and authentication, ``aiohttp`` for the transport) are the
``[cluster]``/``[scheduler]`` extras': a module that needs one imports it, so the base install
imports only what it uses.
"""
