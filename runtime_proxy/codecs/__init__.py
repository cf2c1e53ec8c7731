"""The wire codecs of the node agent, pure (no I/O, no state): messages of each protocol to facts,
plans to messages. ``cri.py`` (kubelet's CRI, ``runtime.v1``), ``nri.py`` (containerd's NRI),
``hook.py`` (Koordinator's RuntimeHookService, ``runtime.v1alpha1``). The doors, the store's
rebuild and the clients call them; they import only the protos and ``hooks``' facts and plans."""
