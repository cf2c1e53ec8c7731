"""NRI mode: the same plugins and pipeline as the proxy, run as a containerd NRI plugin.

- ``mux``: the NRI multiplexer (two logical connections over one unix socket).
- ``ttrpc``: ttrpc message framing and envelopes.
- ``connection``: one asyncio session over the socket: serves the Plugin service on connection
  1 and calls the Runtime service on connection 2.
- ``plugin``: registration, event subscription, dispatch of the Plugin methods, reconnect.
- ``adapter``: NRI pods and containers to facts, pipeline stages to NRI replies and applier writes.
- ``cli``: ``runtime-proxy nri``.
"""
