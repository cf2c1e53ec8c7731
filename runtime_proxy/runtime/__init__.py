"""The container runtime as a client sees it: ``client.py`` (``RuntimeClient``, the CRI gRPC
client the store's rebuild, the loops and the commands use) over ``unary.py`` (unary gRPC calls
over HTTP/2 by ``h2``, without the gRPC library)."""
