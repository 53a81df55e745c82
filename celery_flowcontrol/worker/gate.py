"""The gate: one worker instance's admission decision for each incoming message.

Called by the strategy wrapper on the consumer's loop, before a pool slot is taken, from
the message headers alone (the body is never decoded): one admission call per message.

* admitted: the slot goes into the ledger and the message runs as usual;
* denied, or a future ETA: the message is committed to the parking table, and only then
  acked (a crash in between redelivers it; the row is unique by task id, so it parks once);
* unknown flow queue or no flow options: the message runs ungated;
* admission backend or SQL unreachable: the message is not acked and not run; the caller
  tries it again after a short delay (logged once per outage). Nothing is lost, no cap is
  exceeded.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from typing import Any

from ..admission.base import AdmissionBackend, Admitted, Ticket
from ..config import QueueConfig
from ..errors import (
    BackendUnavailableError,
    FlowControlError,
    InvalidTicketError,
    ParkingUnavailableError,
    UnknownQueueError,
)
from ..parking import ParkedMessage, ParkingRejectedError, ParkingStore
from .headers import FlowOptions, read_options, ticket_id, warn_once
from .ledger import Entry, Ledger
from .waker import Waker

logger = logging.getLogger(__name__)

#: A message whose ETA is less than this far ahead is not worth parking.
ETA_SLACK = 0.05
#: Properties that belong to one delivery, not to the message.
_DELIVERY_ONLY = ("delivery_info", "delivery_tag", "body_encoding")


class Outcome(enum.Enum):
    RUN = "run"          # admitted: hand to the pool
    UNGATED = "ungated"  # not flow-controlled: hand to the pool
    PARKED = "parked"    # stored and acked: done here
    DEFER = "defer"      # a service is down: try this message again later


class Gate:
    """Admission, parking and release for one worker instance."""

    def __init__(self, *, backend: AdmissionBackend, store: ParkingStore, waker: Waker,
                 instance: str, configs: Callable[[str], QueueConfig | None],
                 clock: Callable[[], float] = time.time) -> None:
        self.backend = backend
        self.store = store
        self.waker = waker
        self.instance = instance
        self.ledger = Ledger()
        self._config_of = configs
        self.clock = clock
        self.parked = 0
        self.admitted = 0
        self._outage: str | None = None

    # -- admission --------------------------------------------------------------------------
    def on_message(self, message: Any, task: Any, ack: Callable[[], Any]) -> Outcome:
        """Decide one message (see the module docstring)."""
        headers = message.headers or {}
        opts = read_options(headers, task)
        if opts is None:
            return Outcome.UNGATED
        try:
            if opts.eta is not None and opts.eta > self.clock() + ETA_SLACK:
                return self._park(message, task, opts, opts.eta, "eta", ack)
            ticket = Ticket(opts.queue, ticket_id(headers), self.instance, opts.priority,
                            opts.key)
            decision = self.backend.try_admit(ticket)
        except UnknownQueueError:
            warn_once("queue", opts.queue, "flow queue %r is not registered: tasks naming it "
                      "run ungated", opts.queue)
            return Outcome.UNGATED
        except InvalidTicketError as exc:
            warn_once("ticket", str(task.name), "task %s can't be flow-controlled (%s): "
                      "running ungated", task.name, exc)
            return Outcome.UNGATED
        except BackendUnavailableError as exc:
            return self._defer("admission backend", exc)
        except ParkingUnavailableError as exc:
            return self._defer("parking database", exc)
        if isinstance(decision, Admitted):
            self._recovered()
            config = self._config_of(opts.queue)
            manual = config is not None and config.release == "manual"
            self.ledger.add((str(headers.get("id")), message.delivery_tag),
                            Entry(decision.slot, manual))
            self.admitted += 1
            return Outcome.RUN
        try:
            return self._park(message, task, opts, decision.retry_at, decision.reason, ack)
        except ParkingUnavailableError as exc:
            # The waiter stays in line; the message stays unacked and comes back to us.
            return self._defer("parking database", exc)

    def _park(self, message: Any, task: Any, opts: FlowOptions, wake_at: float, reason: str,
              ack: Callable[[], Any]) -> Outcome:
        headers = message.headers or {}
        task_id = str(headers.get("id"))
        info = message.delivery_info or {}
        props = {k: v for k, v in (message.properties or {}).items() if k not in _DELIVERY_ONLY}
        parked = ParkedMessage(
            task_id=task_id, queue=opts.queue, body=bytes(message.body), wake_at=wake_at,
            task_name=str(task.name), priority=opts.priority, fairness_key=opts.key,
            content_type=message.content_type or "application/json",
            content_encoding=message.content_encoding or "utf-8", headers=dict(headers),
            properties=props, exchange=info.get("exchange") or "",
            routing_key=info.get("routing_key") or "", reason=reason)
        try:
            self.store.park(parked)
        except ParkingRejectedError as exc:
            # Not an outage: this message can never be parked. Keep it in the dead-letter
            # table (visible to operators) rather than loop on it.
            logger.error("flowcontrol: task %s can't be parked (%s): dead-lettered", task_id, exc)
            self.store.dead_letter(parked, "park-rejected", exc)
            self.backend.withdraw(opts.queue, ticket_id(headers))
        self._recovered()
        ack()  # only now: the row is committed
        self.parked += 1
        self.waker.parked(task_id)
        return Outcome.PARKED

    def _defer(self, what: str, exc: FlowControlError) -> Outcome:
        if self._outage is None:
            logger.error("flowcontrol: %s unreachable (%s); messages stay in the broker and "
                         "are retried", what, exc)
        self._outage = what
        return Outcome.DEFER

    def _recovered(self) -> None:
        if self._outage is not None:
            logger.warning("flowcontrol: %s reachable again", self._outage)
            self._outage = None

    # -- release ----------------------------------------------------------------------------
    def finish(self, task_id: str, delivery_tag: Any) -> None:
        """A message settled (result, failure, retry, revoke...): release its slot once."""
        entry = self.ledger.pop((task_id, delivery_tag))
        if entry is not None and not entry.manual:
            self.release(entry.slot.slot_id)

    def release(self, slot_id: str) -> None:
        try:
            self.backend.release(slot_id)
        except FlowControlError as exc:
            logger.warning("flowcontrol: release of %s failed (%s); retrying", slot_id, exc)
            self.waker.retry_release(slot_id)

    def slot_of(self, task_id: str, delivery_tag: Any) -> str | None:
        entry = self.ledger.get((task_id, delivery_tag))
        return None if entry is None else entry.slot.slot_id

    def close(self) -> None:
        """Warm shutdown: release what was admitted but never finished."""
        for entry in self.ledger.drain():
            if not entry.manual:
                self.release(entry.slot.slot_id)

    def stats(self) -> dict[str, Any]:
        """This instance's admission figures."""
        return {"instance": self.instance, "held": self.ledger.held(),
                "admitted": self.admitted, "parked": self.parked, "woken": self.waker.woken}
