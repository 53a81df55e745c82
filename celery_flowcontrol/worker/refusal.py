"""A call past a waiting bound is refused: it ends FAILURE with ``FlowQueueFull``, never run.

``max_waiting``, ``per_key_max_waiting`` and a key's own ``max_waiting`` bound how many calls may
wait (docs/tenants.md). A producer that sees the backend refuses such a call at
``apply_async``; a message that comes anyway (a producer without ``FlowControl(app)``, a
foreign one, a flood that filled the line after the producer looked) is answered by admission
with a :class:`~celery_flowcontrol.admission.values.Refused` decision. Waiting would break the
bound and running would break the caps, so the gate hands it here:

* its end is stored first: state ``FAILURE`` with the ``FlowQueueFull`` naming queue, key and
  bound in the result backend (unless the task ignores results), so ``AsyncResult.get()``
  raises it and nothing is dropped silently;
* then the slots the same delivery took for ``acquire_slot`` are given back, and the message is
  acked (:attr:`Outcome.REFUSED`: done here; it is never parked and never run).

A result backend that fails leaves the message unacked (:attr:`Outcome.DEFER`), to be decided
again: a refusal is never acked before it is stored. The gate counts refusals per queue (its
``stats()``: ``flowcontrol_stats``); the backend counts them fleet-wide (``QueueStats.refused``:
``list``, ``keys``, the dashboard and the ``flowcontrol_refused_total`` metric).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from celery.backends.base import DisabledBackend
from celery.states import FAILURE

from ..admission.values import Refused
from .delivery import Delivery, Outcome
from .release import Releases

__all__ = ["Refusals"]

logger = logging.getLogger(__name__)


class Refusals:
    """Ends refused deliveries in the result backend, then acks them; counts them by queue."""

    def __init__(self, releases: Releases) -> None:
        self.releases = releases
        #: Refusals this worker instance ended, by queue.
        self.counts: dict[str, int] = {}

    def refuse(self, d: Delivery, decision: Refused, held: Iterable[str] = ()) -> Outcome:
        """End *d* as refused by *decision*, giving back the slots *held* (ids) it took."""
        exc = decision.error()
        task = d.task
        try:
            if self._stores(task, d.headers):
                task.backend.store_result(d.task_id, exc, FAILURE)
        except Exception as outage:  # never acked before its end is stored
            logger.warning("flowcontrol: task %s is refused (%s) but its result can't be "
                           "stored yet: %r", d.task_id, exc, outage)
            for slot_id in held:
                self.releases.release(slot_id)
            return Outcome.DEFER
        for slot_id in held:
            self.releases.release(slot_id)
        self.counts[decision.queue] = self.counts.get(decision.queue, 0) + 1
        logger.warning("flowcontrol: task %s (%s) refused: %s", d.task_id, task.name, exc)
        d.ack()
        return Outcome.REFUSED

    @staticmethod
    def _stores(task: Any, headers: dict[str, Any]) -> bool:
        """True when the task's end goes to a result backend (as Celery decides it)."""
        if task.ignore_result or headers.get("ignore_result"):
            return False
        return not isinstance(task.backend, DisabledBackend)
