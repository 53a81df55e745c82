"""Grant announcements of the Redis backend: a pub/sub listener in a daemon thread.

The Lua scripts ``PUBLISH`` every grant on ``<prefix>:grants`` as a JSON array
``[queue, task_id, slot_id, granted_at, expires_at, instance]`` (times as ``%.17g`` strings,
exact floats; *instance* is the waiter's, see :class:`~..values.Grant`). :class:`GrantListener`
subscribes once, decodes each message into a :class:`~..values.Grant` and calls the callback on
its own thread. When the connection drops it
reconnects with a growing pause; grants published meanwhile are missed, which is why
``pending_grants`` exists for pollers.

A release that grants slots on also returns their payloads, and the releasing process's
listeners deliver them at once on its thread (:meth:`GrantListener.deliver_here`, through
:meth:`Listeners.released`); each grant is delivered once, by whichever copy comes first.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import BackendUnavailableError
from ..base import Subscription
from ..values import Grant, GrantCallback

logger = logging.getLogger(__name__)

#: How long one wait for a message lasts: bounds how late ``close()`` is noticed.
POLL = 0.2
#: Pauses between reconnection attempts grow from the first to the last value.
RECONNECT_MIN, RECONNECT_MAX = 0.1, 2.0
#: How many grant payloads a listener remembers to drop their second copy (see _Once).
ONCE_WINDOW = 1024


def decode_grant(data: bytes | str) -> Grant:
    """The :class:`Grant` a published payload describes."""
    queue, task_id, slot_id, granted_at, expires_at, *rest = json.loads(data)
    # Five fields from scripts older than the instance (a rolling upgrade): no routing hint.
    instance = rest[0] if rest and isinstance(rest[0], str) else None
    return Grant(queue, task_id, slot_id, float(granted_at), float(expires_at), instance)


class _Once:
    """Grant payloads delivered once, by whichever copy came first (the releasing process's
    reply or pub/sub), so the other copy is dropped; the oldest are forgotten past *size*
    (a copy lost with a connection, or grants other processes made, which come only once)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._seen: dict[bytes, None] = {}
        self._lock = threading.Lock()

    def first(self, data: bytes | str) -> bool:
        """True for the first copy of *data*, False for the second."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        with self._lock:
            if raw in self._seen:
                del self._seen[raw]
                return False
            self._seen[raw] = None
            if len(self._seen) > self._size:
                del self._seen[next(iter(self._seen))]
            return True


class GrantListener(Subscription):
    """Calls *callback* for each grant published on *channel*, until :meth:`close`.

    The constructor returns once the server confirmed the subscription, so every grant made
    after it returns is delivered (while the connection holds); if the first attempt fails it
    raises :class:`BackendUnavailableError`. Later connection losses are retried quietly.
    """

    def __init__(self, client: Any, channel: str, callback: GrantCallback, redis: Any,
                 on_close: Callable[[GrantListener], None] | None = None,
                 ready_timeout: float = 10.0) -> None:
        self._client = client
        self._channel = channel
        self._callback = callback
        self._redis = redis
        self._on_close = on_close
        self._closed = threading.Event()
        self._first_attempt_done = threading.Event()  # first attempt done: subscribed, or failed
        self._subscribed = False
        self._first_error: BaseException | None = None
        self._once = _Once(ONCE_WINDOW)
        self._thread = threading.Thread(target=self._run, name=f"flowcontrol-grants-{channel}",
                                        daemon=True)
        self._thread.start()
        if not self._first_attempt_done.wait(ready_timeout) or not self._subscribed:
            self.close()
            raise BackendUnavailableError(
                f"could not subscribe to {channel!r}: {self._first_error or 'timed out'}"
            ) from self._first_error

    def _subscribe(self) -> Any:
        pubsub = self._client.pubsub()
        try:
            pubsub.subscribe(self._channel)
            # Wait for the confirmation: from then on the server delivers every PUBLISH.
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and not self._closed.is_set():
                msg = pubsub.get_message(timeout=POLL)
                if msg is not None and msg["type"] == "subscribe":
                    return pubsub
            raise self._redis.TimeoutError("no subscribe confirmation")
        except BaseException:
            pubsub.close()
            raise

    def deliver_here(self, data: bytes | str) -> None:
        """Deliver a grant this process made (the reply of its release) at once, on the
        caller's thread. The waiter's worker is often the releasing one: its hand-over then
        skips the listener thread's wake-up, which waits for the interpreter lock that a busy
        consumer loop holds. Whichever copy comes first is delivered, the other dropped."""
        if self._once.first(data):
            self._deliver(data)

    def _deliver(self, data: bytes | str) -> None:
        try:
            grant = decode_grant(data)
        except (ValueError, TypeError):
            logger.warning("ignoring a malformed grant message on %s: %r", self._channel, data)
            return
        try:
            self._callback(grant)
        except Exception:  # a subscriber's bug must not stop the listener
            logger.exception("grant callback failed for %s", grant)

    def _run(self) -> None:
        pubsub = None
        pause = RECONNECT_MIN
        while not self._closed.is_set():
            try:
                if pubsub is None:
                    pubsub = self._subscribe()
                    self._subscribed = True
                    self._first_attempt_done.set()
                    pause = RECONNECT_MIN
                msg = pubsub.get_message(timeout=POLL)
                if msg is not None and msg["type"] == "message":
                    if self._once.first(msg["data"]):  # not delivered by deliver_here
                        self._deliver(msg["data"])
            except (self._redis.RedisError, OSError) as exc:
                if not self._first_attempt_done.is_set():
                    self._first_error = exc
                    self._first_attempt_done.set()
                    break  # the constructor raises; nobody is listening yet
                logger.warning("grant listener on %s lost its connection (%s); retrying in "
                               "%.1f s", self._channel, exc, pause)
                if pubsub is not None:
                    self._close_quietly(pubsub)
                    pubsub = None
                self._closed.wait(pause)
                pause = min(pause * 2, RECONNECT_MAX)
        if pubsub is not None:
            self._close_quietly(pubsub)

    @staticmethod
    def _close_quietly(pubsub: Any) -> None:
        try:
            pubsub.close()
        except Exception:  # the connection is already gone; nothing to release
            pass

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5.0)
        if self._on_close is not None:
            try:
                self._on_close(self)
            except ValueError:
                pass  # already forgotten


class Listeners:
    """The grant listeners one backend started in this process."""

    def __init__(self, client: Any, channel: str, redis: Any) -> None:
        self._client = client
        self._channel = channel
        self._redis = redis
        self._all: list[GrantListener] = []

    def subscribe(self, callback: GrantCallback) -> GrantListener:
        """A new listener calling *callback* for every grant (see :class:`GrantListener`)."""
        listener = GrantListener(self._client, self._channel, callback, self._redis,
                                 self._all.remove)
        self._all.append(listener)
        return listener

    def released(self, r: Any) -> bool:
        """release.lua's reply: whether the slot was busy. When freeing it granted slots on,
        the reply holds their announcements too: they go to these listeners now."""
        if isinstance(r, list):
            for listener in list(self._all):
                for payload in r[1:]:
                    listener.deliver_here(payload)
            return True
        return bool(r == 1)

    def close(self) -> None:
        """Stop every listener."""
        for listener in list(self._all):
            listener.close()
