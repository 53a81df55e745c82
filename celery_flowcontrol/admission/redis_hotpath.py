"""The hot path's client: ``EVALSHA`` on connections of the client's own pool, directly.

redis-py spends about half of a small script's round trip in Python around the socket: the
pool's lock and per-call health poll, metrics hooks, the retry wrapper, the response
callbacks. ``try_admit`` and ``release`` run on every task, so they talk to a connection
themselves: pack, send, read. Everything else (and every Redis Cluster client) goes through
redis-py's ordinary ``Script`` objects.

Connections come from the client's pool (so its settings, TLS and limits apply) and are kept
in a small free list, one per thread that is inside a call at the same moment; a forked child
forgets its parent's. A NOSCRIPT reply loads the script on that connection and sends again;
a dropped connection is reconnected and the call sent once more, as redis-py's default retry
does (admission is idempotent by task id, so a repeat is safe).
"""

from __future__ import annotations

import os
import weakref
from typing import Any


def _forget_after_fork(ref: weakref.ref[HotPath]) -> None:
    hot = ref()
    if hot is not None:
        hot.forget()


class HotPath:
    """Calls registered redis-py ``Script`` objects through pooled connections directly."""

    def __init__(self, client: Any, redis: Any) -> None:
        self._pool = client.connection_pool
        self._idle: list[Any] = []
        self._no_script = redis.exceptions.NoScriptError
        self._dropped = (redis.ConnectionError, redis.TimeoutError)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    def __call__(self, script: Any, key: str, args: list[Any]) -> Any:
        """``EVALSHA`` *script* with one key and *args*; the parsed reply."""
        try:
            conn = self._idle.pop()  # atomic under the GIL: one thread per connection
        except IndexError:
            conn = self._pool.get_connection()
        try:
            return self._send(conn, script, key, args)
        finally:
            self._idle.append(conn)

    def _send(self, conn: Any, script: Any, key: str, args: list[Any]) -> Any:
        loaded = retried = False
        while True:
            try:
                conn.send_packed_command(conn.pack_command("EVALSHA", script.sha, 1, key, *args))
                return conn.read_response()
            except self._no_script:
                if loaded:
                    raise
                loaded = True  # the server restarted or was flushed: teach it, send again
                conn.send_command("SCRIPT", "LOAD", script.script)
                sha = conn.read_response()
                script.sha = sha.decode() if isinstance(sha, bytes) else sha
            except self._dropped:
                conn.disconnect()
                if retried:
                    raise
                retried = True

    def forget(self) -> None:
        """Drop the free list without closing it (a forked child shares the parent's sockets)."""
        self._idle = []

    def close(self) -> None:
        """Give the idle connections back to the pool."""
        idle, self._idle = self._idle, []
        for conn in idle:
            self._pool.release(conn)
