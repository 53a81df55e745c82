"""Republishing parked rows: the due ones (the waker's poll, beat) and any claimed batch.

Claim, publish, then delete: a row is leased while it is being republished, so a crash
between publish and delete republishes it again (at-least-once, as Celery itself) rather
than losing it. The delete remembers the row as woken (``ParkingStore.woken``). A row that
can never be published is dead-lettered, never looped.

On RabbitMQ a wake publish is confirmed (:func:`~celery_flowcontrol.compat.confirming`): it is
mandatory and waits for the broker's ack, so a row is deleted only once the broker has taken
its message. One the broker refuses (an exchange that does not exist, no queue bound to its
routing key, a nack) keeps its row: it is tried again after :data:`RETRY_AFTER` seconds per
claim, and dead-lettered with the broker's reason once its claims reach :data:`WAKE_ATTEMPTS`.
The Redis transport has no confirms: a publish is done when Redis answers its push.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kombu.exceptions import OperationalError

from ..admission.base import AdmissionBackend
from ..compat import PublishRefused, confirming
from ..parking import ParkedMessage, ParkingStore
from ..protocol import ticket_id
from ..reasons import DeadReason
from .crashpoints import crashpoint
from .message import publish_parked, served_last_first
from .quarantine import Quarantine

logger = logging.getLogger(__name__)

#: The dead-letter reason of a parked row that could not be published again.
WAKE_FAILED = DeadReason.WAKE_FAILED
#: Claims after which a row whose publish the broker keeps refusing is dead-lettered.
WAKE_ATTEMPTS = 5
#: Seconds, per claim so far, before a row whose publish was refused is tried again.
RETRY_AFTER = 1.0


def wake_due(app: Any, store: ParkingStore, clock: Callable[[], float] = time.time,
             limit: int = 200, backend: AdmissionBackend | None = None, *,
             quarantine: Quarantine | None = None) -> int:
    """Republish every parked message due by *clock*; how many (the poller and beat).
    *quarantine* dead-letters what can't be published (default: one of *store* and *backend*)."""
    total = 0
    quarantine = quarantine if quarantine is not None else Quarantine(store, backend)
    while True:
        batch = store.claim_due(clock(), limit=limit)
        if not batch:
            return total
        total += republish(app, store, batch, clock, quarantine=quarantine)
        if len(batch) < limit:
            return total


def republish(app: Any, store: ParkingStore, messages: list[ParkedMessage],
              clock: Callable[[], float] = time.time,
              backend: AdmissionBackend | None = None, *,
              quarantine: Quarantine | None = None) -> int:
    """Publish claimed messages one by one, then delete their rows; how many were published.

    A row that can't be published (a value kombu or the broker refuses) is moved to the
    dead-letter table with the reason by *quarantine* (default: one of *store* and *backend*:
    taken out of its line there too), and never delays
    the rows after it. A publish the broker refuses (a channel error, or on RabbitMQ a
    confirmed publish returned or nacked) keeps its row: it is tried again on a later pass,
    after :data:`RETRY_AFTER` seconds per claim so far, and only once its claims reach
    :data:`WAKE_ATTEMPTS` is it dead-lettered, with the broker's reason. Without confirms
    (other transports) a channel error is not pinned on the row being sent, as the error may
    surface on a later publish. When the broker can't be reached, the rows not published yet
    are unclaimed (woken again on a later pass) and the error raised.
    """
    dead = quarantine if quarantine is not None else Quarantine(store, backend)
    published: list[ParkedMessage] = []
    again: list[ParkedMessage] = []
    rest = list(messages)
    crashpoint("wake.claimed")
    try:
        with app.producer_pool.acquire(block=True) as producer:
            connection = producer.connection
            outage = (*connection.connection_errors, OperationalError)
            refused = (*connection.channel_errors, PublishRefused)
            sender = confirming(producer) or producer
            if served_last_first(producer):
                rest.reverse()  # each goes to the head: the first in line is sent last
            while rest:
                m = rest[0]
                try:
                    publish_parked(sender, m, clock())
                except outage:
                    raise
                except refused as exc:
                    if m.attempts >= WAKE_ATTEMPTS:
                        dead.put(m, WAKE_FAILED, exc, parked=True)
                    else:
                        logger.warning("flowcontrol: the broker refused parked task %s (%s: %s); "
                                       "trying again", m.task_id, type(exc).__name__, exc)
                        again.append(m)
                    if sender is producer:  # a confirming producer takes a new channel itself
                        producer.revive(connection.channel())
                except Exception as exc:
                    dead.put(m, WAKE_FAILED, exc, parked=True)
                else:
                    published.append(m)
                rest.pop(0)
    finally:
        if published:
            crashpoint("wake.published")
            # Deleted, and remembered as woken: a copy of one the broker delivers again (its
            # node died between the park's commit and its ack) is then not run (park.py).
            store.wakes.record(published, [ticket_id(m.headers) for m in published])
        if rest:
            store.unclaim([m.task_id for m in rest])
        for attempts in sorted({m.attempts for m in again}):
            store.unclaim([m.task_id for m in again if m.attempts == attempts],
                          wake_at=clock() + RETRY_AFTER * max(attempts, 1))
    return len(published)
