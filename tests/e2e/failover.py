"""A TCP relay on 127.0.0.1 in front of several replicas of one server, as a Service with one
endpoint per replica looks to its client: each new connection goes to the first backend in
:attr:`Failover.order` that accepts it (a dead replica refuses, so the next one gets it), and the
bytes are copied both ways unchanged (TLS, if any, stays end to end).

kube-scheduler keeps its connection to an extender alive, so one replica gets every call until
that connection ends: :meth:`Failover.prefer` puts a backend first and closes the open
connections, so the client's next call reaches that replica. Threads only; everything on
loopback.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Sequence


class Failover:
    """See the module docstring; *backends* are ports on 127.0.0.1, tried in order."""

    def __init__(self, backends: Sequence[int]) -> None:
        self.order = list(backends)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="failover", daemon=True)
        self.connections: dict[int, int] = {port: 0 for port in backends}
        """How many connections each backend got."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Failover:
        self._thread.start()
        return self

    def prefer(self, port: int) -> None:
        """New connections go to *port* first; the open ones are closed."""
        with self._lock:
            self.order = [port, *(p for p in self.order if p != port)]
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
        self.prefer(self.order[0])  # closes what is open
        self._thread.join(10)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="failover-conn", daemon=True).start()

    def _connect(self) -> socket.socket | None:
        with self._lock:
            order = list(self.order)
        for port in order:
            try:
                upstream = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                continue
            upstream.settimeout(None)
            with self._lock:
                self.connections[port] = self.connections.get(port, 0) + 1
            return upstream
        return None

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:
            client.close()
            return
        with self._lock:
            self._open.update((client, upstream))
        pump = threading.Thread(target=self._copy, args=(upstream, client), name="failover-pump", daemon=True)
        pump.start()
        self._copy(client, upstream)
        pump.join()
        with self._lock:
            self._open.difference_update((client, upstream))
        client.close()
        upstream.close()

    @staticmethod
    def _copy(source: socket.socket, sink: socket.socket) -> None:
        """Copy until either side ends, then end both (a replica's death ends its client's too)."""
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
