"""A loopback TCP relay in front of one port: a real network fault, placed exactly.

:attr:`TcpProxy.silent` set holds the server's replies back (requests still get through);
:meth:`TcpProxy.cut` is packet loss: nothing is forwarded either way and new connections hang,
but no connection is reset (TCP would keep retransmitting), until :meth:`TcpProxy.heal`
delivers what was held; :meth:`TcpProxy.drop` resets every connection, as a failed link would.
"""

from __future__ import annotations

import socket
import threading
import time

from tests.support.services import free_port


class TcpProxy(threading.Thread):
    """A relay from a free loopback port to *target_port*; started on creation."""

    def __init__(self, target_port: int) -> None:
        super().__init__(daemon=True)
        self.target = target_port
        self.port = free_port()
        self.silent = threading.Event()  # replies are held back while set
        self.refusing = threading.Event()  # new connections are closed at once while set
        self.up = True
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        self._stopped = False
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self.start()

    @property
    def url(self) -> str:
        """A Redis URL through the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def run(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.refusing.is_set():  # as a server that is down: no connection is made
                client.close()
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _hold(self, replies: bool) -> None:
        while not self._stopped and (not self.up or (replies and self.silent.is_set())):
            time.sleep(0.005)

    def _connect(self, client: socket.socket) -> None:
        self._hold(replies=False)  # a SYN during the loss is answered only once the network is back
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self._pairs.append((client, upstream))
        threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
        threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                self._hold(replies)
                data = src.recv(65536)
                if not data:
                    break
                self._hold(replies)  # bytes sent into the loss arrive after it, as retransmits would
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def lose(self) -> None:
        """Lose every packet from now on (both directions)."""
        self.up = False

    def heal(self) -> None:
        """The network is back."""
        self.up = True

    def cut(self) -> None:
        """Reset every connection through the relay, as a failed network would."""
        pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        self._stopped = True
        self.up = True
        self.silent.clear()
        self._server.close()
        self.cut()
