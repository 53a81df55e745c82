"""The one place that reaches past redis-py's public API, and why.

The hot path (:mod:`.wire`) and the event-loop calls (:mod:`.loop`) write
``EVALSHA`` commands to a pooled connection's socket and parse the replies themselves: the
sync path because redis-py's public route (``send_packed_command`` + ``read_response``,
without hiredis) costs noticeably more CPU per call than one ``sendall`` + ``recv`` +
:func:`~.wire.parse` (and the hot path runs twice per task), the loop path because
it must read without blocking and hand a file descriptor to kombu's hub, which redis-py's
reader can't do at all. For that they need two things redis-py gives no public way to,
and one public call whose signature changed:

``socket_of(conn)``
    A connection's socket, ``Connection._sock`` (``None`` while disconnected). Connecting
    stays redis-py's: ``Connection.connect`` (TLS, AUTH, SELECT, protocol).
``error_of(message)``
    The exception redis-py raises for an error reply (``NOSCRIPT ...`` -> ``NoScriptError``,
    ``READONLY ...`` -> ``ReadOnlyError``, ``LOADING ...`` -> ``BusyLoadingError``, ...), so a
    reply read here fails exactly as through redis-py: ``BaseParser.parse_error`` of the
    private module ``redis._parsers.base`` (redis-py >= 5.0; it was ``redis.connection``
    before). Copying its table would drift from the redis-py that is installed.
``take_connection(pool)``
    Not private, but not one signature: ``ConnectionPool.get_connection`` requires a
    command name before redis-py 5.3 and deprecates passing one since.

``tests/unit/test_redis_wire.py`` holds each of these to what the two callers rely on, so a
redis-py release that moves one fails there, by name, rather than on the hot path.
"""

from __future__ import annotations

import inspect
import socket
from typing import Any

from redis._parsers.base import BaseParser

__all__ = ["error_of", "socket_of", "take_connection"]


_WANTS_NAME: dict[type, bool] = {}


def _wants_command_name(pool: Any) -> bool:
    # redis-py < 5.3: get_connection(command_name, *keys, **options); later the name is
    # optional and passing it warns. The deprecation wrapper keeps the signature (wraps).
    wants = _WANTS_NAME.get(type(pool))
    if wants is None:
        try:
            param = inspect.signature(pool.get_connection).parameters.get("command_name")
        except (TypeError, ValueError):
            param = None
        wants = _WANTS_NAME[type(pool)] = param is not None and param.default is inspect.Parameter.empty
    return wants


def take_connection(pool: Any) -> Any:
    """A connection from *pool* (``release`` it to the same pool), on every redis-py >= 5.0."""
    if _wants_command_name(pool):
        return pool.get_connection("EVALSHA")
    return pool.get_connection()


def socket_of(conn: Any) -> socket.socket:
    """The socket of redis-py connection *conn*, connected first by redis-py's own
    ``connect`` if it is not (its ``disconnect`` closes and forgets it)."""
    sock = conn._sock
    if sock is None:
        conn.connect()
        sock = conn._sock
    if sock is None:
        raise ConnectionError("redis-py connected, but the connection has no socket")
    return sock


def error_of(message: str) -> Exception:
    """The exception redis-py raises for the error reply *message* (without its ``-``)."""
    return BaseParser.parse_error(message)
