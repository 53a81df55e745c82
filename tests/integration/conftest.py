"""Fixtures of the integration tests that need a server of their own."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from tests.conftest import in_ci, wait_until


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A throwaway redis-server of this test's own, free to be flushed and restarted."""
    server = shutil.which("redis-server")
    if server is None:
        if in_ci():
            pytest.fail("redis-server is not installed (.ci/run installs it)", pytrace=False)
        pytest.skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    assert wait_until(lambda: _pings(client), 10)
    try:
        yield url
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


class Proxy:
    """A TCP relay in front of a Redis server that a test can make silent or cut: a real
    network fault, placed exactly."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.silent = threading.Event()  # replies are held back while set
        self.refusing = threading.Event()  # new connections are closed at once while set
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._listener.getsockname()[1]}/0"
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing.is_set():  # as a server that is down: no connection is made
                client.close()
                continue
            server = socket.create_connection(self.upstream)
            self._pairs.append((client, server))
            threading.Thread(target=self._pump, args=(client, server, None), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.silent), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, hold: threading.Event | None) -> None:
        try:
            while data := src.recv(65536):
                while hold is not None and hold.is_set():
                    time.sleep(0.005)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        """Drop every connection through the relay, as a failed network would."""
        pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


@pytest.fixture
def redis_proxy(own_redis: str) -> Iterator[Proxy]:
    """A :class:`Proxy` in front of this test's own Redis server."""
    parts = urlsplit(own_redis)
    proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 6379))
    yield proxy
    proxy.silent.clear()
    proxy.close()
