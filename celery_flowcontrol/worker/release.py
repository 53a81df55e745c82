"""Release: a finished message's slots go back to their queues, once.

The gate's ledger says what each admitted message holds; :class:`Releaser` frees it when the
request finishes (request.py calls the runtime's releaser from every path a request can finish
by), when Celery dropped it unrun on a broker reconnect (:meth:`Releaser.finish_dropped`, which
asks :func:`will_finish`), and at a warm shutdown. On the consumer's event loop (the
:class:`~.consumer_loop.ConsumerLoop` the admission calls are sent on too) a quiet queue's
release is sent without waiting; a release that fails (an outage) goes to :class:`RetryLater`
(the waker's chores), retried until it lands.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

from celery.worker.state import active_requests

from ..admission.base import AdmissionBackend, queue_of_slot
from ..errors import FlowControlError
from ..protocol import EPHEMERAL_RE, acquire_ticket, read_acquire, read_options
from .consumer_loop import ConsumerLoop
from .crashpoints import crashpoint
from .delivery import Delivery
from .ledger import Ledger

logger = logging.getLogger(__name__)


class Releases(Protocol):
    """Gives a slot back (what a part that took one needs of the releaser)."""

    def release(self, slot_id: str, queue: str | None = None,
                then: Callable[[], Any] | None = None) -> None:
        """Free *slot_id* (of *queue*, when the caller knows it); *then* once it is free."""


class RetryLater(Protocol):
    """Takes a release that failed, to try it again until it lands (the waker's chores)."""

    def retry_release(self, slot_id: str) -> None:
        """Release *slot_id* later."""


class Releaser:
    """Frees the slots of one worker instance's finished messages."""

    def __init__(self, *, backend: AdmissionBackend, ledger: Ledger, retries: RetryLater,
                 loop: ConsumerLoop) -> None:
        self.backend = backend
        self.ledger = ledger
        self.retries = retries
        self.loop = loop  # its calls are used when on its thread

    def finish(self, task_id: str, delivery_tag: Any) -> None:
        """A message finished (result, failure, retry, revoke...): release its slots once."""
        admission = self.ledger.pop((task_id, delivery_tag))
        if admission is not None and admission.entries:
            crashpoint("release.before")
        for entry in admission.entries if admission is not None else ():
            if not entry.manual:
                queue = entry.slot.queue
                # A flow_group's queue goes when its group is done (or idle: a member still in
                # the broker re-creates it from its name). Asked once this release is in: on
                # the loop, a quiet queue's release waits for the next send, and asked before
                # it the queue is never idle.
                group = queue.startswith("fg.") and EPHEMERAL_RE.fullmatch(queue)
                self.release(entry.slot.slot_id, queue,
                             functools.partial(self._forget, queue) if group else None)

    def release(self, slot_id: str, queue: str | None = None,
                then: Callable[[], Any] | None = None) -> None:
        """Free *slot_id* (of *queue*, when the caller knows it); *then* once it is free."""
        loop = self.loop.current()
        # On the loop only in a quiet queue: where waiters are, the grant this release makes
        # goes to a waiter lingering here at once, on this thread, and that hand-over is the
        # latency of the whole line.
        if loop is not None and queue is None:
            queue = queue_of_slot(slot_id)
        if loop is not None and queue is not None and loop.quiet(queue):
            def released(result: bool | FlowControlError) -> None:
                if isinstance(result, FlowControlError):
                    self._failed(slot_id, result)
                    return
                crashpoint("release.after")
                if then is not None:
                    then()

            loop.release(slot_id, released)
            return
        try:
            self.backend.release(slot_id)
        except FlowControlError as exc:
            self._failed(slot_id, exc)
            return
        crashpoint("release.after")
        if then is not None:
            then()

    def finish_dropped(self, pool: Any) -> int:
        """After a broker reconnect (the bootstep calls it as the consumer starts again):
        release the slots of what Celery dropped unrun with the lost connection
        (:func:`will_finish`). No hook of theirs would ever run: their slots
        would stay held for good (re-asserted by the heartbeat), and the broker's second
        delivery of each would wait here for a first one that never finishes. How many."""
        dropped = [key for key, admission in self.ledger.items()
                   if admission.request is not None
                   and not will_finish(admission.request, pool)]
        for task_id, delivery_tag in dropped:
            self.finish(task_id, delivery_tag)
        if dropped:
            logger.warning("flowcontrol: %d admitted task(s) dropped unrun with the lost broker "
                           "connection; their slots are released and the broker delivers them "
                           "again", len(dropped))
        return len(dropped)

    def withdraw(self, d: Delivery) -> None:
        """Take the tickets of *d* (a revoked or expired message) out of line, best effort: a
        lost waiter is pruned after waiter_ttl anyway."""
        opts = read_options(d.headers, d.task)
        tickets = [(q, acquire_ticket(d.task_id, q)) for q in read_acquire(d.headers)]
        if opts is not None:
            tickets.append((opts.queue, d.ticket))
        for queue, ticket in tickets:
            try:
                self.backend.withdraw(queue, ticket)
            except FlowControlError:
                pass

    def close(self) -> None:
        """Warm shutdown: release what was admitted but never finished."""
        for entry in self.ledger.drain():
            if not entry.manual:
                self.release(entry.slot.slot_id)

    def _failed(self, slot_id: str, exc: FlowControlError) -> None:
        logger.warning("flowcontrol: release of %s failed (%s); retrying", slot_id, exc)
        self.retries.retry_release(slot_id)

    def _forget(self, queue: str) -> None:
        try:
            self.backend.unregister(queue, only_if_idle=True)
        except FlowControlError:
            pass  # it stays until a later member finishes; harmless


def will_finish(request: Any, pool: Any) -> bool:
    """False if Celery dropped *request* unrun when its broker connection was lost.

    ``Consumer.on_close`` (before the consumer starts again) forgets every request no pool
    process has accepted: one waiting for a free process (the pool's semaphore), in a
    rate-limit bucket or on the ETA timer, and, in the prefork pool, one handed to the pool
    but not accepted yet (``AsynPool.flush`` takes it out of the job cache). The broker
    delivers those again; none of the hooks above is ever called for them. Call it only
    then: before ``on_close``, a request waiting for a process is just waiting.
    """
    if request in active_requests:  # a pool process took it: it finishes as usual
        return True
    result_ref = request._apply_result
    if result_ref is None:  # never handed to the pool
        return False
    cache = getattr(getattr(pool, "_pool", None), "_cache", None)
    if cache is None:  # a pool that runs what it was handed (threads, eventlet, gevent)
        return True
    job = result_ref()
    return job is not None and cache.get(getattr(job, "_job", None)) is job
