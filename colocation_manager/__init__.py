"""The co-location manager (``colocation-manager``, also ``scheduler-ext manager``): what
koord-manager's slo-controller and pod webhook do, for clusters without Koordinator. A product
beside the extender (``scheduler_ext``), sharing no code with it: both stand on the one
Kubernetes access layer (``rhp_kube``) and the formats (``koord_formats``).

Pure parts (no I/O, no clock): ``resources`` (batch and mid formulas, when to write),
``objects`` (Node and Pod JSON to the formulas' inputs), ``profile`` (the
ClusterColocationProfile mutation and the batch-resource validation). The
``koord_formats.colocation`` and ``koord_formats.sloconfig`` modules parse slo-controller-config.
"""
