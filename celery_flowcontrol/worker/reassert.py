"""Re-assertion: tell an admission backend that forgot this instance which slots it holds.

A backend forgets an instance when its state is lost (a Redis restarted without persistence)
or when the instance's lease lapsed while its tasks still ran. Its running tasks then hold
slots nobody counts, and new admissions would run past the cap until they end. So each
instance hands the slots of its ledger to :meth:`AdmissionBackend.restore` with every
heartbeat (the backend acts on the first call after it forgot the instance, and ignores the
rest), for each configured queue (re-creating the ones that are gone) and each queue it holds
slots in; the gate does the same for a queue found missing at admission.

The heartbeat rides the consumer's timer, which stops while the consumer reconnects to the
broker; the pool's tasks run on meanwhile. :class:`HeartbeatWatch` keeps the lease (and the
re-assertion) going from a thread of its own when that timer has been silent too long, so a
broker outage longer than ``instance_ttl`` does not free the slots of running tasks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from ..admission.base import AdmissionBackend
from ..config import QueueConfig
from ..errors import FlowControlError
from ..protocol import ephemeral_config
from .ledger import Ledger

logger = logging.getLogger(__name__)


def restore_queue(backend: AdmissionBackend, instance: str, config: QueueConfig,
                  ledger: Ledger) -> list[str]:
    """Restore what *ledger* holds in queue ``config.name`` (creating the queue if it is
    gone); the ids the backend recorded again."""
    held = ledger.entries(config.name)
    ids = backend.restore(instance, config, [e.slot for e in held])
    if ids:
        logger.warning("flowcontrol: the admission backend had forgotten %d slot(s) of queue %r "
                       "held by %s; restored", len(ids), config.name, instance)
        # A task that settled while the call was on its way released a slot the backend did
        # not know yet: release it again now that it is known (a manual slot outlives its
        # task: it stays). Ids are never reused, so a second release changes nothing.
        manual = {e.slot.slot_id for e in held if e.manual}
        still = {e.slot.slot_id for e in ledger.entries(config.name)}
        for slot_id in set(ids) - still - manual:
            backend.release(slot_id)
    return ids


class Reasserter:
    """The waker's heartbeat chore: :func:`restore_queue` for every configured queue and
    every queue this instance holds a slot in."""

    def __init__(self, *, backend: AdmissionBackend, instance: str, ledger: Ledger,
                 configured: Iterable[QueueConfig],
                 config_of: Callable[[str], QueueConfig | None]) -> None:
        self.backend = backend
        self.instance = instance
        self.ledger = ledger
        self.configured = {c.name: c for c in configured}
        self.config_of = config_of
        self.last = time.monotonic()  # when the last pass began (HeartbeatWatch reads it)

    def __call__(self) -> int:
        """One pass; how many slots were restored."""
        self.last = time.monotonic()
        names = dict.fromkeys([*self.configured, *(e.slot.queue for e in self.ledger.entries())])
        restored = 0
        for name in names:
            config = self.configured.get(name) or ephemeral_config(name) or self.config_of(name)
            if config is not None:
                restored += len(restore_queue(self.backend, self.instance, config, self.ledger))
        return restored


class HeartbeatWatch(threading.Thread):
    """Heartbeat and re-assert from this thread whenever the waker's chores have not done it
    for 1.5 heartbeat intervals (the consumer's timer is stopped while it reconnects)."""

    def __init__(self, reasserter: Reasserter, every: float) -> None:
        super().__init__(name="flowcontrol-heartbeat-watch", daemon=True)
        self.reasserter = reasserter
        self.every = every
        self._halt = threading.Event()

    def run(self) -> None:
        r = self.reasserter
        while not self._halt.wait(self.every / 2):
            if time.monotonic() - r.last < self.every * 1.5:
                continue
            try:
                r.backend.heartbeat(r.instance)
                r()
            except FlowControlError as exc:  # the waker logs outages; try again next round
                logger.debug("flowcontrol: heartbeat watch: %s", exc)
            except Exception:  # the thread must survive a bug
                logger.exception("flowcontrol: heartbeat watch failed")

    def stop(self) -> None:
        self._halt.set()
