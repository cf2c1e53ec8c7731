"""What both command lines (``runtime-proxy`` and ``scheduler-ext``) share to be operated the same
way: the structlog set-up (``rhp_ops.logs``), build information (``rhp_ops.build``) and the
global flags, ``--version`` and one-line usage errors (``rhp_ops.cli``).

Imports neither ``runtime_proxy`` nor ``scheduler_ext``; both import it.
"""
