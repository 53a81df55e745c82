"""The gate: one worker instance's admission decision for each incoming message.

Called by the strategy wrapper on the consumer's loop, before a pool slot is taken, from
the message headers alone (the body is never decoded): one admission call per message.

* admitted: the slot goes into the ledger and the message runs as usual;
* denied, or a future ETA: the message is committed to the parking table, and only then
  acked (a crash in between redelivers it; the row is unique by task id, so it parks once);
* refused (a waiting bound is full: ``max_waiting``): ended FAILURE with ``FlowQueueFull`` in
  the result backend, then acked, never run nor parked (refusal.py);
* denied for concurrency while there is room for it to linger (linger.py): kept unacked for a short
  while, and asked again when its grant comes (or its linger bound passes: then it parks);
  denied by a rate limit until an instant within the linger bound: kept so until then;
* unknown flow queue or no flow options: the message runs ungated;
* a second copy of one wake (a publish the broker took twice): acked unrun, the copy taken
  first is the one decided (twins.py);
* admission backend or SQL unreachable: the message is not acked and not run; the caller
  tries it again after a short delay (logged once per outage). Nothing is lost, no cap is
  exceeded.

The gate only decides, on a :class:`~.delivery.Delivery`; it asks the backend through
admitter.py (on the consumer's event loop through asking.py, which hands each reply back
through its ``Replies`` interface), parks and dead-letters through park.py (parkbatch.py on
the loop) and releases through release.py. It builds none of them: the runtime does
(runtime.py's ``build_gate``) and hands the gate the parts it decides with; no part is handed
a method of another to call back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..admission.base import (
    KEY_RATE,
    RATE,
    AdmissionBackend,
    Admitted,
    Decision,
    Denied,
    Refused,
)
from ..config import QueueConfig
from ..errors import (
    BackendUnavailableError,
    CostRefusedError,
    FlowControlError,
    InvalidTicketError,
    ParkingUnavailableError,
    UnknownQueueError,
)
from ..parking import ParkingStore
from ..protocol import acquire_ticket, read_acquire, read_options
from ..reasons import Reason
from .asking import ETA_SLACK
from .costs import dead_letter_cost
from .delivery import Delivery, DeliveryState, Outcome, decide_once
from .ledger import Admission

if TYPE_CHECKING:  # the parts' types; the runtime builds them (runtime.py)
    from .admitter import Admitter
    from .asking import LoopAsks
    from .delivery import Outage
    from .ledger import Ledger
    from .linger import Lingering
    from .park import Parker
    from .parkbatch import ParkBatch
    from .refusal import Refusals
    from .release import Releaser
    from .twins import Twins

__all__ = ["ETA_SLACK", "Gate", "Outcome"]

logger = logging.getLogger(__name__)


class Gate:
    """One worker instance's admission decision; parks, releases, asks through its parts."""

    def __init__(self, *, backend: AdmissionBackend, store: ParkingStore, instance: str,
                 configs: Callable[[str], QueueConfig | None], clock: Callable[[], float],
                 lingering: Lingering, ledger: Ledger, outage: Outage, parker: Parker,
                 asks: LoopAsks, releaser: Releaser, batch: ParkBatch, refusals: Refusals,
                 admitter: Admitter, twins: Twins) -> None:
        self.backend = backend
        self.store = store
        self.instance = instance
        self.lingering = lingering
        self.ledger = ledger
        self._config_of = configs
        self.clock = clock
        self.admitted = 0
        self.outage = outage  # shared with the batch, which parks on the loop
        self.parker = parker
        self.asks = asks  # its replies come back to this gate (asking.py's Replies)
        self.releaser = releaser
        self.batch = batch
        self.refusals = refusals
        self.admitter = admitter
        self.twins = twins  # the wakes whose copy this worker took (twins.py)

    @property
    def parked(self) -> int:
        """Messages this instance parked."""
        return self.parker.parked

    # -- admission --------------------------------------------------------------------------
    def on_message(self, message: Any, task: Any, ack: Callable[[], Any],
                   resume: Callable[[], Any] | None = None,
                   later: Callable[[Outcome], Any] | None = None,
                   state: DeliveryState | None = None) -> Outcome:
        """Decide one message (see the module docstring). With *resume* (which decides the
        message again, without letting it linger), a denied message may linger instead of being parked.
        With *later*, the admission call may be answered on the event loop: the result is
        then :attr:`Outcome.ASKED` and the outcome goes to *later* when the reply comes.
        *state* is shared by every decision of one delivery (delivery.py): once one of them
        ran, parked or let it through, this one is refused (:attr:`Outcome.DECIDED`)."""
        return decide_once(Delivery(message, task, message.headers or {}, ack, resume, later,
                                    state=state or DeliveryState()), self._on_message)

    def _on_message(self, d: Delivery) -> Outcome:
        message, task, later = d.message, d.task, d.later
        if self.twins.twin(message, d.headers):
            return self._twin(d)
        early = self.asks.early(message.delivery_tag) if later is not None else None
        loop = self.asks.current() if early is not None else None
        try:
            if early is not None and loop is not None:
                # Asked for already (early.py), in this turn of the loop, after the checks
                # _decide makes (no future ETA, not running or asked for here): take the reply.
                d.opts = early.opts
                self.lingering.seen(d.opts)
                return self.asks.ask(loop, d)
            d.opts, d.pending = read_options(d.headers, task), read_acquire(d.headers)
            if d.opts is None and not d.pending:
                return Outcome.UNGATED
            return self._decide(d)
        except CostRefusedError as exc:
            return dead_letter_cost(self.parker, d, exc)  # never run, never looped (costs.py)
        except BackendUnavailableError as exc:
            return self.outage.defer("admission backend", exc)
        except ParkingUnavailableError as exc:
            # A waiter stays in line; the message stays unacked and comes back to us.
            return self.outage.defer("parking database", exc)

    def _twin(self, d: Delivery) -> Outcome:
        """*d* is a second copy of a wake whose first this worker took (twins.py): acked unrun."""
        logger.info("flowcontrol: task %s is delivered twice by one wake; the copy taken first "
                    "is the one that runs, this one is acked", d.task_id)
        self.asks.forget_early(d.message.delivery_tag)
        self.twins.acked += 1
        d.ack()
        return Outcome.PARKED

    def _decide(self, d: Delivery) -> Outcome:
        now = self.clock()
        opts = d.opts
        if opts is not None and opts.expires is not None and opts.expires < now:
            # Expired (often in the parking table, which wakes a row at its expiry): Celery
            # marks it REVOKED, as it does any expired task, and it takes no slot. Out of
            # line first, or a grant made to it would wait for grant_ttl.
            self.withdraw(d.message, d.task)
            return Outcome.UNGATED
        if opts is not None and opts.eta is not None and opts.eta > now + ETA_SLACK:
            return self._hold(d, opts.queue, opts.eta, Reason.ETA, opts.eta - now)  # near: lingers
        if opts is not None and self.asks.taken(opts.queue, d.ticket):
            # Another delivery of this very message is admitted (or being asked for) here and
            # not finished (the broker redelivered what a dropped channel left unacked, while
            # the first copy still waits in the pool). Admission would give both the one slot
            # they share, and they would run side by side: this copy waits, unacked, until the
            # first finishes.
            logger.info("flowcontrol: task %s is delivered again while its first delivery "
                        "runs here; it waits for that one to finish", d.task_id)
            return Outcome.DEFER
        if opts is None:
            return self._decided(d, None)
        self.lingering.seen(opts)  # a flow_priority: its order is not the broker's (linger.py)
        loop = self.asks.current() if d.later is not None and not d.pending else None
        if loop is not None:
            return self.asks.ask(loop, d)
        return self._decided(d, self.admitter.admit(d.task, opts.queue, d.ticket, opts.priority,
                                                     opts.key, opts.label, opts.cost))

    def replied(self, d: Delivery, tid: str, result: Decision | FlowControlError) -> Outcome:
        """The outcome of *d* whose admission call, asked on the event loop, got *result*
        (asking.py's ``Replies``).
        Refused if another decision of the delivery decided it for good meanwhile: a slot *result*
        holds is that decision's too (admission is idempotent by ticket), so it stays."""
        return decide_once(d, lambda d: self._replied(d, tid, result))

    def _replied(self, d: Delivery, tid: str, result: Decision | FlowControlError) -> Outcome:
        opts = d.opts
        assert opts is not None
        try:
            decision: Decision | None
            if isinstance(result, CostRefusedError):
                return dead_letter_cost(self.parker, d, result)  # never run, never looped (costs.py)
            if isinstance(result, (UnknownQueueError, InvalidTicketError)):
                # Rare: the waiting path re-creates a lost queue, or warns and runs it.
                decision = self.admitter.admit(d.task, opts.queue, tid, opts.priority, opts.key,
                                               opts.label, opts.cost)
            elif isinstance(result, FlowControlError):
                raise result
            else:
                decision = result
            d.pending = {}
            return self._decided(d, decision)
        except BackendUnavailableError as exc:
            return self.outage.defer("admission backend", exc)
        except ParkingUnavailableError as exc:
            return self.outage.defer("parking database", exc)
        except Exception:
            # A bug must not lose the message: it stays unacked and is tried again.
            logger.exception("flowcontrol: admission of task %s failed; retrying later",
                             d.task_id)
            return Outcome.DEFER

    def _decided(self, d: Delivery, decision: Decision | None) -> Outcome:
        """Act on the queue's *decision* (``None``: not flow-controlled), then take the slots
        of the pending ``acquire_slot`` calls; RUN when the message may run now."""
        now = self.clock()
        opts, task_id = d.opts, d.task_id
        admission = Admission()
        priority, key = (opts.priority, opts.key) if opts else (0, task_id)
        if opts is not None:
            if isinstance(decision, Refused):
                return self.refusals.refuse(d, decision)  # never run, never parked (refusal.py)
            if isinstance(decision, Denied):
                # A rate-held one whose turn is near waits for it here (linger.py: may).
                turn = decision.retry_at - now if decision.reason in (RATE, KEY_RATE) else None
                return self._hold(d, opts.queue, decision.retry_at, decision.reason, turn)
            if decision is None and not d.pending:
                return Outcome.UNGATED
            if decision is not None:
                self.lingering.moved(opts.queue)  # its line is active: a denial next may linger
                admission.primary = decision.slot.slot_id
                admission.entries.append(self.admitter.entry(decision.slot))
        for queue, (deadline, label) in d.pending.items():
            tid = acquire_ticket(task_id, queue)
            decision = self.admitter.admit(d.task, queue, tid, priority, key, label)
            if decision is None:
                admission.unknown.append(queue)
            elif isinstance(decision, Admitted):
                admission.acquired[queue] = decision.slot.slot_id
                admission.entries.append(self.admitter.entry(decision.slot))
            elif isinstance(decision, Refused):
                return self.refusals.refuse(d, decision, [e.slot.slot_id for e in admission.entries])
            elif now >= deadline:
                self.backend.withdraw(queue, tid)
                admission.expired.append(queue)
            else:
                # A parked task holds nothing: give back every slot this decision took (its
                # queue's and those of earlier acquire_slot calls); the next run asks again.
                for entry in admission.entries:
                    self.releaser.release(entry.slot.slot_id)
                return self.batch.park(d, queue, min(decision.retry_at, deadline), Reason.CONCURRENCY)
        adopted = self.parker.adopt(d, admission.entries)
        if adopted is None:
            return Outcome.DEFER  # its own wake is not finished: decided again later (park.py)
        if not adopted:
            return Outcome.PARKED  # a copy of its parked row runs instead (park.py)
        self.outage.recovered()
        self.ledger.add((task_id, d.message.delivery_tag), admission)
        self.admitted += 1
        return Outcome.RUN

    def withdraw(self, message: Any, task: Any) -> None:
        """Take a revoked message's tickets out of line (release.py)."""
        self.releaser.withdraw(Delivery(message, task, message.headers or {}, lambda: None))

    def _hold(self, d: Delivery, queue: str, wake_at: float, reason: str,
              turn: float | None) -> Outcome:
        """Let *d* linger (linger.py ``may``; its turn *turn* s away), else park it until *wake_at*.
        Never while its row waits parked (redelivered after a crash between commit and ack, it
        would run and the row run again: the park path meets the row and acks); a row being
        woken is this very copy's (one read by primary key)."""
        priority = d.opts.priority if d.opts is not None else 0
        if (d.resume is not None and not d.pending
                and self.lingering.may(reason, turn, queue, priority)
                and not self.store.waiting(d.task_id, self.clock())
                and self.lingering.add(d.ticket, queue, d.resume, self._config_of(queue), turn,
                                       priority)):
            self.outage.recovered()
            return Outcome.LINGERING
        return self.batch.park(d, queue, wake_at, reason)  # now, or with the loop's others

    def close(self) -> None:
        """Warm shutdown: release what was admitted but never finished."""
        self.asks.detach()
        self.batch.close()
        self.releaser.close()

    def stats(self) -> dict[str, Any]:
        """This instance's decisions: what it holds, admitted, parked and refused (the
        runtime adds the waker's and the lingering waiters' figures)."""
        return {"instance": self.instance, "held": self.ledger.held(),
                "admitted": self.admitted, "parked": self.parked, "park_batches": self.batch.batches,
                "refused": dict(self.refusals.counts)}
