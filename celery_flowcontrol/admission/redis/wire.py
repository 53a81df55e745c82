"""The hot path's client: ``EVALSHA`` on connections of the client's own pool, directly.

For a small script, much of a round trip through redis-py is Python around the socket: the
pool's lock and per-call health poll, metrics hooks, the retry wrapper, the response
callbacks, and a reply parser that reads line by line through a buffer object. ``try_admit``
and ``release`` run on every task, so they talk to a connection's socket themselves: pack the
command, one ``sendall``, ``recv`` until :func:`parse` has a whole reply. Everything else (and
every Redis Cluster client) goes through redis-py's ordinary ``Script`` objects.

Connections come from the client's pool (so its settings, TLS, auth and limits apply: the
pool connects them) and are kept in a small free list, one per thread that is inside a call
at the same moment; a forked child forgets its parent's. A NOSCRIPT reply loads the script on
that connection and sends again; a dropped connection is reconnected and the call sent once
more, as redis-py's default retry does (admission is idempotent by task id, so a repeat is
safe). Any failure mid-call drops the connection, so no half-read reply is left on it.

The connection's socket and redis-py's exception for an error reply are reached through
:mod:`.redispy`, the one module that goes past redis-py's public API.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from .redispy import error_of, socket_of, take_connection

RECV = 65536


class Incomplete(Exception):
    """The buffer ends before the reply does: read more."""


class ReplyError:
    """An error reply nested in an array (a top-level one is raised instead)."""

    def __init__(self, message: str) -> None:
        self.message = message


def parse(buf: bytes, pos: int = 0) -> tuple[Any, int]:
    """The RESP reply starting at *buf[pos]* and the position after it; bulk strings as
    bytes, errors as :class:`ReplyError`. :class:`Incomplete` if *buf* ends first."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise Incomplete
    kind = buf[pos]
    if kind == 36:  # "$" bulk string
        n = int(buf[pos + 1:end])
        if n < 0:
            return None, end + 2
        stop = end + 2 + n
        if len(buf) < stop + 2:
            raise Incomplete
        return buf[end + 2:stop], stop + 2
    if kind == 58:  # ":" integer
        return int(buf[pos + 1:end]), end + 2
    if kind == 42:  # "*" array
        n = int(buf[pos + 1:end])
        pos = end + 2
        if n < 0:
            return None, pos
        out = []
        for _ in range(n):
            value, pos = parse(buf, pos)
            out.append(value)
        return out, pos
    if kind == 43:  # "+" status
        return buf[pos + 1:end], end + 2
    if kind == 45:  # "-" error
        return ReplyError(buf[pos + 1:end].decode("utf-8", "replace")), end + 2
    if kind == 95:  # RESP3 "_" null
        return None, end + 2
    if kind == 35:  # RESP3 "#" boolean (a Lua true)
        return buf[pos + 1:end] == b"t", end + 2
    raise ValueError(f"unexpected reply type {chr(kind)!r}")


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
        self._heads: dict[tuple[str, str, tuple[str, ...], int], bytes] = {}
        self._no_script = redis.exceptions.NoScriptError
        # READONLY: the connection reaches a master demoted to a replica (a Sentinel or
        # cluster failover while it stayed up); nothing was written, so reconnecting (a
        # Sentinel-managed connection asks for the new master) and sending again is safe.
        self._dropped = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ReadOnlyError)
        self._timeout_error = redis.TimeoutError
        self._connection_error = redis.ConnectionError
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget_after_fork(ref))

    def __call__(self, script: Any, rkey: str, common: tuple[str, ...],
                 args: tuple[str | int, ...]) -> Any:
        """``EVALSHA`` *script* with one redis key *rkey*, then *common* (the same every call) and *args*
        as ARGV; the parsed reply."""
        try:
            conn = self._idle.pop()  # atomic under the GIL: one thread per connection
        except IndexError:
            conn = take_connection(self._pool)
        try:
            return self._send(conn, script, rkey, common, args)
        finally:
            self._idle.append(conn)

    def head(self, script: Any, rkey: str, common: tuple[str, ...], n: int) -> bytes:
        """The first bytes of every ``EVALSHA`` of *script* on *rkey* with *n* arguments after
        *common*: the length, ``EVALSHA``, the sha, the redis key and *common* (kept)."""
        head = self._heads.get((script.sha, rkey, common, n))
        if head is None:
            if len(self._heads) > 4096:  # bounded: queues x scripts, normally a few dozen
                self._heads.clear()
            parts: tuple[str | int, ...] = ("EVALSHA", script.sha, 1, rkey, *common)
            head = b"*%d\r\n" % (len(parts) + n) + b"".join([bulk(a) for a in parts])
            self._heads[(script.sha, rkey, common, n)] = head
        return head

    def command(self, script: Any, rkey: str, common: tuple[str, ...],
                args: tuple[str | int, ...]) -> bytes:
        """The ``EVALSHA`` of *script* as RESP bytes (see :meth:`__call__`)."""
        # RESP by hand: redis-py's pack_command encodes every argument each time. Runs for
        # every call of the hot path: comprehensions, no per-argument function call.
        data = [a.encode() if isinstance(a, str) else b"%d" % a for a in args]
        return self.head(script, rkey, common, len(args)) + b"".join(
            [b"$%d\r\n%s\r\n" % (len(d), d) for d in data])

    def _send(self, conn: Any, script: Any, rkey: str, common: tuple[str, ...],
              args: tuple[str | int, ...]) -> Any:
        loaded = retried = False
        while True:
            try:
                return self._roundtrip(conn, self.command(script, rkey, common, args))
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

    def _roundtrip(self, conn: Any, command: bytes) -> Any:
        """Send *command* on *conn*'s socket and read its one reply."""
        sock = socket_of(conn)  # connected by the pool's own connect: TLS, AUTH, SELECT, protocol
        try:
            sock.sendall(command)
            buf = b""
            while True:
                chunk = sock.recv(RECV)
                if not chunk:
                    raise self._connection_error("Connection closed by server.")
                buf += chunk
                try:
                    reply, end = parse(buf)
                    break
                except Incomplete:
                    pass  # a long reply, or one split by the network: read on
        except TimeoutError:  # the socket's (builtin), not redis.TimeoutError
            conn.disconnect()
            raise self._timeout_error("Timeout reading from socket") from None
        except OSError as exc:
            conn.disconnect()
            raise self._connection_error(f"Error while talking to Redis: {exc}") from exc
        except ValueError as exc:  # not a reply parse() knows: the stream is out of step
            conn.disconnect()
            raise self._connection_error(f"Protocol error: {exc}") from exc
        except BaseException:
            conn.disconnect()  # a reply may be left half read: never reuse this socket
            raise
        if end != len(buf):  # more than one reply: out of step, so start afresh next time
            conn.disconnect()
        if isinstance(reply, ReplyError):
            raise error_of(reply.message)
        return reply

    def forget(self) -> None:
        """Drop the free list without closing it (a forked child shares the parent's sockets)."""
        self._idle = []

    def close(self) -> None:
        """Give the idle connections back to the pool."""
        idle, self._idle = self._idle, []
        for conn in idle:
            self._pool.release(conn)
