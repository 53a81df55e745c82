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


def bulk(value: str | int) -> bytes:
    """One RESP bulk string (UTF-8; ints in decimal)."""
    data = value.encode() if isinstance(value, str) else b"%d" % value
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _forget_after_fork(ref: weakref.ref[HotPath]) -> None:
    hot = ref()
    if hot is not None:
        hot.forget()


class HotPath:
    """Calls registered redis-py ``Script`` objects through pooled connections directly."""

    def __init__(self, client: Any, redis: Any) -> None:
        self._pool = client.connection_pool
        self._idle: list[Any] = []
        self._heads: dict[tuple[str, str, tuple[str, ...]], bytes] = {}
        self._no_script = redis.exceptions.NoScriptError
        self._dropped = (redis.ConnectionError, redis.TimeoutError)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    def __call__(self, script: Any, key: str, common: tuple[str, ...],
                 args: tuple[str | int, ...]) -> Any:
        """``EVALSHA`` *script* with one *key*, then *common* (the same every call) and *args*
        as ARGV; the parsed reply."""
        try:
            conn = self._idle.pop()  # atomic under the GIL: one thread per connection
        except IndexError:
            conn = self._pool.get_connection()
        try:
            return self._send(conn, script, key, common, args)
        finally:
            self._idle.append(conn)

    def _head(self, sha: str, key: str, common: tuple[str, ...]) -> bytes:
        head = self._heads.get((sha, key, common))
        if head is None:
            if len(self._heads) > 4096:  # bounded: queues x scripts, normally a few dozen
                self._heads.clear()
            parts: tuple[str | int, ...] = ("EVALSHA", sha, 1, key, *common)
            head = self._heads[(sha, key, common)] = b"".join([bulk(a) for a in parts])
        return head

    def _send(self, conn: Any, script: Any, key: str, common: tuple[str, ...],
              args: tuple[str | int, ...]) -> Any:
        loaded = retried = False
        while True:
            try:
                # RESP by hand: redis-py's pack_command encodes every argument each time.
                conn.send_packed_command([b"*%d\r\n%s%s" % (
                    4 + len(common) + len(args), self._head(script.sha, key, common),
                    b"".join([bulk(a) for a in args]))])
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
