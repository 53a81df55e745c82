"""Admission calls on the worker's event loop: ``try_admit`` and ``release`` without the wait.

Features
    A worker's consumer runs kombu's event loop (the hub) on one thread: it reads messages,
    feeds the pool, reads results and acks. A synchronous admission call stops that loop for
    one round trip to Redis, and every task makes two (admit, release); on a small machine
    the wait, not Redis, is most of an admission's cost (figures: benchmarks/REPORT.md). On
    the hub both calls are written to a connection of their own, and the loop goes on with
    other messages and results; the connection is one of the hub's readers, and each reply,
    as it comes (Redis answers in order), goes to the callback of the call it answers. Each
    decision is still one script call, the same script, with the same reply.

    Each send wakes Redis and costs the loop a system call, so calls share sends where nobody
    waits for them: a call goes out at once, with whatever waits before it, but a release in
    a *quiet* queue (its last admission here found no waiter at all, and no release here has
    granted a slot since) waits for the next call's send, ``LINGER`` at the most: nobody
    needs that slot yet.

Replies read early
    :meth:`LoopCalls.poll` hands over the replies already in, without waiting: a call sent
    early (the gate sends a message's admission before kombu's own round trip for it,
    early.py) is usually answered by the time its message reaches the strategy, which then
    decides at once, in the same turn of the loop. Reads never block: a readiness the hub
    saw before a poll read the data finds nothing and returns. (On a TLS connection, whose
    reads can't be made non-blocking per call, replies are read on readiness only.)

Connection
    One connection of the backend's pool (its URL, TLS, auth and limits), taken by the first
    call and given back by :meth:`LoopCalls.close`. Calls are sent from the hub's thread
    only; the gate uses the synchronous calls everywhere else.

Errors
    A connection that fails (can't be made, fails on send or on receive, is closed by the
    server, or a reply is not back within ``reply_timeout``) is dropped and every call still
    waiting on it gets a :class:`~celery_flowcontrol.errors.BackendUnavailableError`: whether
    it took effect is unknown, and the caller tries again (an admission is idempotent by
    ticket, a release by slot id). The next call connects again. A NOSCRIPT reply (the server
    restarted or was flushed) loads the script and sends that call again; any other error
    reply is that call's error alone. Either way each call is answered exactly once, on its
    callback: ``admit`` and ``release`` never raise.
"""

from __future__ import annotations

import collections
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailableError, CostRefusedError, FlowControlError, InvalidTicketError
from ..values import Decision, Ticket
from . import codec
from .redispy import error_of, socket_of, take_connection
from .wire import RECV, Incomplete, ReplyError, parse

if TYPE_CHECKING:
    from .grants import Listeners
    from .scripts import Scripts

logger = logging.getLogger(__name__)

#: Seconds a release of a quiet queue may wait to share the next admission's send.
LINGER = 0.002

#: What a call hands its callback: its result, or the error it met.
AdmitDone = Callable[[Decision | FlowControlError], None]
ReleaseDone = Callable[[bool | FlowControlError], None]


class _Call:
    """One command on the wire: its bytes, its script (to load it again) and who waits."""

    __slots__ = ("command", "script", "reply", "sent")

    def __init__(self, command: bytes, script: Any, reply: Callable[[Any], None]) -> None:
        self.command = command
        self.script = script
        self.reply = reply  # takes the raw reply, or a FlowControlError
        self.sent = time.monotonic()


class LoopCalls:
    """``try_admit`` and ``release`` of a :class:`~.backend.RedisBackend`, answered on *hub*:
    the backend's *scripts* make the commands, its *listeners* get the grants a release makes.
    """

    def __init__(self, scripts: Scripts, listeners: Listeners, hub: Any,
                 reply_timeout: float = 10.0) -> None:
        self._scripts = scripts
        self._listeners = listeners
        self._hub = hub
        assert scripts.hot is not None  # on_event_loop makes none without it
        self._pool = scripts.client.connection_pool
        self._conn: Any = None
        self._sock: Any = None  # the socket of _conn, while it is ours
        self._fd = -1
        self._calls: collections.deque[_Call] = collections.deque()
        self._out: list[bytes] = []  # commands of _calls not written yet, in the same order
        self._linger: Any = None  # the timer that sends lazy releases at the latest
        self._lazy_since: float | None = None  # when the first lazy call not sent was made
        self._quiet: set[str] = set()  # queues whose last admission found no waiter at all
        self._buf = b""
        self._dontwait = 0  # recv flags: MSG_DONTWAIT, or 0 on TLS (never polled then)
        self.reply_timeout = reply_timeout
        #: The thread that may send (the hub's); others call the backend directly.
        self.thread = threading.get_ident()
        self._watch = hub.call_repeatedly(1.0, self._check_overdue)

    def __len__(self) -> int:
        """Calls sent and not answered yet."""
        return len(self._calls)

    # -- the two calls ----------------------------------------------------------------------
    def admit(self, ticket: Ticket, done: AdmitDone) -> None:
        """:meth:`RedisBackend.try_admit`; *done* gets the decision (or the error) later."""
        quiet = self._quiet

        def reply(r: Any) -> None:
            if isinstance(r, FlowControlError):
                return done(r)
            if r == codec.COST_REFUSED:  # as try_admit, without a blocking read of the config
                return done(CostRefusedError(f"cost {ticket.cost:g} is above what a per-cost "
                                             "limit admits", ticket.queue, "flow_cost"))
            # admit.lua answers its fast path (no waiter at all, nothing due) with a string.
            if isinstance(r, bytes):
                quiet.add(ticket.queue)
            else:
                quiet.discard(ticket.queue)
            try:
                decision = codec.decision(ticket, codec.known(r, ticket.queue))
            except FlowControlError as exc:  # an unknown queue
                return done(exc)
            return done(decision)

        try:
            command = self._scripts.admit_command(ticket)
        except FlowControlError as exc:  # a name no queue can have
            done(exc)
            return
        except UnicodeEncodeError:
            try:
                codec.check_utf8(ticket)  # Ticket lets lone surrogates through; this names the field
            except InvalidTicketError as exc:
                done(exc)
            return
        self._queue(_Call(command, self._scripts.by_name["admit"], reply))

    def quiet(self, queue: str) -> bool:
        """True if *queue* is quiet: its last admission here found no waiter at all, and no
        release here has granted a slot on since."""
        return queue in self._quiet

    def release(self, slot_id: str, done: ReleaseDone) -> None:
        """:meth:`RedisBackend.release`; *done* gets whether the slot was busy (grants it
        made are delivered to this process's listeners first)."""
        queue = self._scripts.rkeys.queue_of(slot_id)
        if queue is None:
            done(False)
            return

        quiet = self._quiet
        released = self._listeners.released

        def reply(r: Any) -> None:
            if isinstance(r, list):  # it granted the slot on: the queue has waiters
                quiet.discard(queue)
            return done(r if isinstance(r, FlowControlError) else released(r))

        try:
            command = self._scripts.release_command(queue, slot_id)
        except FlowControlError as exc:
            done(exc)
            return
        self._queue(_Call(command, self._scripts.by_name["release"], reply), queue in quiet)

    # -- the wire ---------------------------------------------------------------------------
    def _queue(self, call: _Call, lazy: bool = False) -> None:
        """Add *call* to the wire's queue and write it now; a lazy one waits for the next
        call's send (LINGER at the latest)."""
        self._calls.append(call)
        self._out.append(call.command)
        if not lazy:
            self._flush()
        elif self._linger is None:
            # One timer at a time, never cancelled: most lazy calls go out with the next call
            # long before it fires, and it then finds nothing to send (a timer per lazy call
            # cost the loop more than the call itself).
            self._lazy_since = call.sent
            self._linger = self._hub.call_later(LINGER, self._lingered)
        elif self._lazy_since is None:
            self._lazy_since = call.sent

    def _lingered(self) -> None:
        self._linger = None  # this is its call
        since = self._lazy_since
        if since is None:
            return  # sent meanwhile
        wait = since + LINGER - time.monotonic()
        if wait > 0:  # the first lazy call still waiting came after this timer was set
            self._linger = self._hub.call_later(wait, self._lingered)
        else:
            self._flush()

    def _flush(self) -> None:
        """Write the calls not written yet, in one send."""
        if not self._out:
            return
        self._lazy_since = None
        data = b"".join(self._out)
        self._out.clear()
        try:
            if self._conn is None:
                self._connect()
            self._sock.sendall(data)
        except (OSError, self._scripts.redis.RedisError) as exc:  # refused, reset, no master
            self._fail(exc)  # each waiting call fails once (raised, one would stay unsent)

    def _connect(self) -> None:
        conn = take_connection(self._pool)
        try:
            sock = socket_of(conn)  # the pool's own connect: TLS, AUTH, SELECT, protocol
        except BaseException:
            self._pool.release(conn)
            raise
        self._conn, self._sock, self._fd, self._buf = conn, sock, sock.fileno(), b""
        self._dontwait = 0 if isinstance(sock, ssl.SSLSocket) else socket.MSG_DONTWAIT
        self._hub.add_reader(self._fd, self._on_readable)

    def poll(self) -> None:
        """Hand over the replies already in, without waiting for more."""
        if self._calls and self._dontwait:
            self._on_readable()

    def _on_readable(self, *_: Any) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            chunk = self._sock.recv(RECV, self._dontwait)
            if not chunk:
                raise ConnectionError("connection closed by the server")
        except BlockingIOError:
            return  # nothing in: a poll read what the hub saw ready
        except OSError as exc:
            self._fail(exc)
            return
        buf, pos = self._buf + chunk, 0
        while self._calls and self._conn is conn:
            try:
                r, pos = parse(buf, pos)
            except Incomplete:
                break
            except ValueError as exc:  # not a reply: the stream is out of step
                self._fail(exc)
                return
            call = self._calls.popleft()
            if isinstance(r, ReplyError):
                self._answer(call, r)
            else:
                self._deliver(call, r)
        if self._conn is conn:
            self._buf = buf[pos:]
            if self._buf and not self._calls:  # a reply nobody asked for: out of step
                self._fail(ValueError("unexpected reply"))

    def _answer(self, call: _Call, r: ReplyError) -> None:
        exc = error_of(r.message)
        if isinstance(exc, self._scripts.redis.exceptions.NoScriptError):
            self._load_and_resend(call)
            return
        self._deliver(call, BackendUnavailableError(f"Redis admission backend: {exc}"))

    def _load_and_resend(self, call: _Call) -> None:
        try:
            self._scripts.load(call.script)
        except self._scripts.redis.RedisError as exc:
            self._deliver(call, BackendUnavailableError(f"Redis admission backend: {exc}"))
            return
        call.sent = time.monotonic()
        self._queue(call)  # behind the calls already on the wire, as it is written

    @staticmethod
    def _deliver(call: _Call, r: Any) -> None:
        try:
            call.reply(r)
        except Exception:  # one caller's bug must not stall the replies of the others
            logger.exception("flowcontrol: handling an admission reply failed")

    def _fail(self, exc: BaseException) -> None:
        """Drop the connection; every call waiting on it gets the error."""
        self._drop()
        self._out.clear()
        self._lazy_since = None
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        calls, self._calls = self._calls, collections.deque()
        error = BackendUnavailableError(f"Redis admission backend: {exc}")
        for call in calls:
            self._deliver(call, error)

    def _drop(self) -> None:
        conn, self._conn, self._sock = self._conn, None, None
        if conn is None:
            return
        try:
            self._hub.remove_reader(self._fd)
        except (KeyError, OSError, ValueError):
            pass  # the hub was reset meanwhile
        conn.disconnect()
        self._pool.release(conn)
        self._buf = b""

    def _check_overdue(self) -> None:
        if self._calls and time.monotonic() - self._calls[0].sent > self.reply_timeout:
            self._fail(TimeoutError(f"no reply within {self.reply_timeout:g} s"))

    # -- the end ----------------------------------------------------------------------------
    def close(self, timeout: float = 2.0) -> None:
        """Stop: wait up to *timeout* for the replies still due and hand them over (on this
        thread), fail the rest, give the connection back."""
        self._watch.cancel()
        self._flush()
        conn = self._conn
        deadline = time.monotonic() + timeout
        while self._calls and self._conn is conn and conn is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._fd], [], [], left)[0]:
                break
            self._on_readable()
        self._fail(TimeoutError("the worker's event loop stopped"))
