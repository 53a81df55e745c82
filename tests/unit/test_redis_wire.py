"""What the hot path and the event-loop calls take from redis-py past its public API
(admission/redis/redispy.py) is still there, and still means what they rely on.

A redis-py release that renames ``Connection._sock``, moves ``BaseParser.parse_error`` or
changes which exception an error reply becomes fails here, by name. No Redis is needed: a
thread on a local socket answers ``+OK`` to each command (redis-py sends ``CLIENT SETINFO``
on connect, and its errors are ignored anyway).
"""

from __future__ import annotations

import socket
import threading
import warnings
from collections.abc import Iterator

import pytest
import redis
from redis.exceptions import (
    BusyLoadingError,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
)

from celery_flowcontrol.admission.redis.redispy import error_of, socket_of, take_connection
from celery_flowcontrol.admission.redis.wire import Incomplete, parse


def answer_ok(conn: socket.socket) -> None:
    buf = b""
    with conn:
        while chunk := conn.recv(4096):
            buf += chunk
            try:
                while buf:
                    _, end = parse(buf)
                    buf = buf[end:]
                    conn.sendall(b"+OK\r\n")
            except Incomplete:
                pass


@pytest.fixture
def server() -> Iterator[socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return  # closed: the test is over
            threading.Thread(target=answer_ok, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield listener
    try:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux)
    except OSError:
        pass
    listener.close()


def pool_of(listener: socket.socket, pool_class: type = redis.ConnectionPool) -> redis.ConnectionPool:
    host, port = listener.getsockname()
    return pool_class(host=host, port=port)


@pytest.mark.parametrize("pool_class", [redis.ConnectionPool, redis.BlockingConnectionPool])
def test_a_connection_is_taken_without_a_deprecation_and_given_back(server: socket.socket,
                                                                   pool_class: type) -> None:
    pool = pool_of(server, pool_class)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # redis-py >= 5.3 warns when given a command name
        conn = take_connection(pool)
    assert isinstance(conn, redis.Connection)
    pool.release(conn)
    assert take_connection(pool) is conn  # the same one, back from the pool
    pool.disconnect()


def test_the_socket_is_the_connections_own_and_connects_through_redis_py(server: socket.socket) -> None:
    conn = redis.Connection(**pool_of(server).connection_kwargs)
    sock = socket_of(conn)  # connects
    assert isinstance(sock, socket.socket)
    assert sock.getpeername() == server.getsockname()
    assert socket_of(conn) is sock  # the same socket while connected
    conn.disconnect()
    assert sock.fileno() == -1  # redis-py closed it...
    again = socket_of(conn)  # ...and forgot it: the next use connects afresh
    assert again is not sock and again.getpeername() == server.getsockname()
    conn.disconnect()


@pytest.mark.parametrize(("reply", "kind", "text"), [
    ("NOSCRIPT No matching script. Please use EVAL.", NoScriptError, "No matching script. Please use EVAL."),
    ("READONLY You can't write against a read only replica.", ReadOnlyError,
     "You can't write against a read only replica."),
    ("LOADING Redis is loading the dataset in memory", BusyLoadingError, "Redis is loading the dataset in memory"),
    ("ERR user_script:1: oops", ResponseError, "user_script:1: oops"),
    ("WRONGTYPE Operation against a key holding the wrong kind of value", ResponseError,
     "WRONGTYPE Operation against a key holding the wrong kind of value"),
])
def test_an_error_reply_becomes_the_exception_redis_py_raises(reply: str, kind: type, text: str) -> None:
    exc = error_of(reply)
    assert type(exc) is kind
    assert str(exc) == text
    # The callers tell a dropped connection (retry) from an answer (raise) by these bases.
    assert isinstance(exc, redis.ConnectionError) == (kind is BusyLoadingError)
