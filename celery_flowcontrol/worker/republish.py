"""Republishing parked rows: the due ones (the waker's poll, beat) and any claimed batch.

Claim, publish, then delete: a row is leased while it is being republished, so a crash
between publish and delete republishes it again (at-least-once, as Celery itself) rather
than losing it. A row that can never be published is dead-lettered, never looped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kombu.exceptions import OperationalError

from ..admission.base import AdmissionBackend
from ..errors import FlowControlError
from ..parking import ParkedMessage, ParkingStore
from ..protocol import ticket_id
from .message import publish_parked, served_last_first

logger = logging.getLogger(__name__)

#: The dead-letter reason of a parked row that could not be published again.
WAKE_FAILED = "wake-failed"
#: Claims after which a row whose publish keeps meeting a channel error is dead-lettered.
WAKE_ATTEMPTS = 5


def wake_due(app: Any, store: ParkingStore, clock: Callable[[], float] = time.time,
             limit: int = 200, backend: AdmissionBackend | None = None,
             ahead: float = 0.0) -> int:
    """Republish every parked message due by *clock* (or within *ahead* seconds of it); how
    many (the poller, the waker's timer and beat)."""
    total = 0
    while True:
        batch = store.claim_due(clock() + ahead, limit=limit)
        if not batch:
            return total
        total += republish(app, store, batch, clock, backend)
        if len(batch) < limit:
            return total


def republish(app: Any, store: ParkingStore, messages: list[ParkedMessage],
              clock: Callable[[], float] = time.time,
              backend: AdmissionBackend | None = None) -> int:
    """Publish claimed messages one by one, then delete their rows; how many were published.

    A row that can't be published (a value kombu or the broker refuses) is moved to the
    dead-letter table with the reason, taken out of its line in *backend*, and never delays
    the rows after it. A channel error is not pinned on the row being sent (RabbitMQ closes
    a channel for a refused publish asynchronously, so the error surfaces on a later one):
    that row is tried again on a later pass, with a new channel, and only a row that met one
    on :data:`WAKE_ATTEMPTS` claims is dead-lettered. When the broker can't be reached, the
    rows not published yet are unclaimed (woken again on a later pass) and the error raised.
    """
    published: list[str] = []
    again: list[str] = []
    rest = list(messages)
    try:
        with app.producer_pool.acquire(block=True) as producer:
            connection = producer.connection
            outage = (*connection.connection_errors, OperationalError)
            if served_last_first(producer):
                rest.reverse()  # each goes to the head: the first in line is sent last
            while rest:
                m = rest[0]
                try:
                    publish_parked(producer, m, clock())
                except outage:
                    raise
                except connection.channel_errors as exc:
                    if m.attempts >= WAKE_ATTEMPTS:
                        quarantine(store, m, exc, backend)
                    else:
                        again.append(m.task_id)
                    producer.revive(connection.channel())
                except Exception as exc:
                    quarantine(store, m, exc, backend)
                else:
                    published.append(m.task_id)
                rest.pop(0)
    finally:
        if published:
            store.done(published)
        if again or rest:
            store.unclaim([*again, *(m.task_id for m in rest)])
    return len(published)


def quarantine(store: ParkingStore, m: ParkedMessage, exc: BaseException,
               backend: AdmissionBackend | None) -> None:
    """Move a parked row that can't be published to the dead-letter table (``celery
    flowcontrol dead``), and take its ticket out of line: a grant made to it passes on."""
    logger.error("flowcontrol: parked task %s can't be published again (%s: %s): "
                 "dead-lettered", m.task_id, type(exc).__name__, exc)
    store.dead_letter(m, WAKE_FAILED, exc)
    store.done([m.task_id])
    if backend is not None:
        try:
            backend.withdraw(m.queue, ticket_id(m.headers))
        except FlowControlError:
            pass  # not in line (or not registered): a lost waiter is pruned anyway
