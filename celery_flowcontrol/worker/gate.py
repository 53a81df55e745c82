"""The gate: one worker instance's admission decision for each incoming message.

Called by the strategy wrapper on the consumer's loop, before a pool slot is taken, from
the message headers alone (the body is never decoded): one admission call per message.

* admitted: the slot goes into the ledger and the message runs as usual;
* denied, or a future ETA: the message is committed to the parking table, and only then
  acked (a crash in between redelivers it; the row is unique by task id, so it parks once);
* denied for concurrency while there is room to hold it (hold.py): kept unacked for a short
  while, and asked again when its grant comes (or the hold ends: then it parks);
* unknown flow queue or no flow options: the message runs ungated;
* admission backend or SQL unreachable: the message is not acked and not run; the caller
  tries it again after a short delay (logged once per outage). Nothing is lost, no cap is
  exceeded.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..admission.base import (
    CONCURRENCY,
    AdmissionBackend,
    Admitted,
    Decision,
    Denied,
    EventLoopCalls,
    Slot,
    Ticket,
    queue_of_slot,
)
from ..config import QueueConfig
from ..errors import (
    BackendUnavailableError,
    FlowControlError,
    InvalidTicketError,
    ParkingUnavailableError,
    UnknownQueueError,
)
from ..parking import ParkedMessage, ParkingRejectedError, ParkingStore
from ..protocol import (
    EPHEMERAL_RE,
    QUEUE_HEADER,
    FlowOptions,
    acquire_ticket,
    ephemeral_config,
    read_acquire,
    read_options,
    ticket_id,
    warn_once,
)
from .early import PENDING, Early
from .hold import Holds
from .ledger import Admission, Entry, Ledger
from .message import parked_of
from .reassert import restore_queue
from .request import will_settle
from .waker import Waker

logger = logging.getLogger(__name__)

#: A message whose ETA is less than this far ahead is not worth parking.
ETA_SLACK = 0.05


class Outcome(enum.Enum):
    RUN = "run"          # admitted: hand to the pool
    UNGATED = "ungated"  # not flow-controlled: hand to the pool
    PARKED = "parked"    # stored and acked: done here
    HELD = "held"        # denied, kept unacked until its grant comes (hold.py)
    DEFER = "defer"      # a service is down: try this message again later
    ASKED = "asked"      # on the event loop: the outcome comes later, to the caller's callback


class Gate:
    """Admission, parking and release for one worker instance."""

    def __init__(self, *, backend: AdmissionBackend, store: ParkingStore, waker: Waker,
                 instance: str, configs: Callable[[str], QueueConfig | None],
                 clock: Callable[[], float] = time.time, holds: Holds | None = None,
                 ledger: Ledger | None = None) -> None:
        self.backend = backend
        self.store = store
        self.waker = waker
        self.instance = instance
        self.holds = holds if holds is not None else Holds(0.0)
        self.ledger = ledger if ledger is not None else Ledger()
        self._config_of = configs
        self.clock = clock
        self.parked = 0
        self.admitted = 0
        self._outage: str | None = None
        self._loop: EventLoopCalls | None = None
        self._asking: set[tuple[str, str]] = set()  # (queue, ticket) asked on the loop
        self._early: dict[Any, Early] = {}  # by delivery tag: asked early (early.py)

    # -- the event loop ---------------------------------------------------------------------
    def attach_loop(self, hub: Any) -> None:
        """From now on, ask and release on *hub* (the consumer's event loop, this thread)
        without waiting, when the backend can (``AdmissionBackend.on_event_loop``). The
        bootstep calls it on every consumer start."""
        self.detach_loop()
        self._loop = self.backend.on_event_loop(hub)

    def detach_loop(self) -> None:
        """Back to waiting calls. Replies still due are waited for briefly and handed over;
        a message admitted meanwhile does not run (its channel is closing: the broker
        delivers it again), so its slot is released."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.close()  # an early reply nobody took is undone meanwhile
        self._asking.clear()
        self._early.clear()

    @property
    def on_loop(self) -> bool:
        """True while admission calls are answered on the event loop (:meth:`attach_loop`)."""
        return self._loop is not None

    def ask_early(self, message: Any, task: Any) -> None:
        """Send *message*'s admission call now, before kombu's own round trip for it, when
        the strategy will ask for it on the loop and its queue is quiet (early.py);
        :meth:`on_message` takes the reply."""
        loop = self._on_loop()
        if loop is None:
            return
        headers = message.headers or {}
        # The queue first: most messages of a queue with a line stop here, at two lookups.
        queue = headers.get(QUEUE_HEADER) or getattr(task, "flow_queue", None)
        if type(queue) is not str or not loop.quiet(queue) or read_acquire(headers):
            return
        opts = read_options(headers, task)
        if opts is None:
            return
        now = self.clock()
        if (opts.eta is not None and opts.eta > now + ETA_SLACK) or (
                opts.expires is not None and opts.expires < now):  # parked, or not gated
            return
        tid = ticket_id(headers)
        if self._taken(opts.queue, tid):
            return
        try:
            ticket = Ticket(opts.queue, tid, self.instance, opts.priority, opts.key, opts.label)
        except InvalidTicketError:
            return
        tag = message.delivery_tag
        early = self._early[tag] = Early(opts, ticket)

        def answered(result: Decision | FlowControlError) -> None:
            if early.then is not None:
                early.then(result)
            elif self._early.get(tag) is early:  # its message never asked: nobody will
                del self._early[tag]
                self._undo(ticket, result)
            else:
                early.result = result  # on_message is reading it (LoopCalls.poll)

        loop.admit(ticket, answered)

    def _undo(self, ticket: Ticket, result: Decision | FlowControlError) -> None:
        """Take back an early admission whose message never asked (early.py), unless this
        worker holds that ticket another way (admission is idempotent by ticket)."""
        if self._taken(ticket.queue, ticket.task_id):
            return
        if isinstance(result, Admitted):
            self.release(result.slot.slot_id)
        elif isinstance(result, Denied):
            try:
                self.backend.withdraw(ticket.queue, ticket.task_id)
            except FlowControlError:
                pass  # a lost waiter is pruned after waiter_ttl

    def _taken(self, queue: str, ticket: str) -> bool:
        """True if a delivery here holds *ticket* of *queue* (admitted, not finished) or is
        being asked for it on the loop."""
        return self.ledger.running(queue, ticket) or (queue, ticket) in self._asking

    def _on_loop(self) -> EventLoopCalls | None:
        loop = self._loop
        return loop if loop is not None and loop.thread == threading.get_ident() else None

    # -- admission --------------------------------------------------------------------------
    def on_message(self, message: Any, task: Any, ack: Callable[[], Any],
                   resume: Callable[[], Any] | None = None,
                   later: Callable[[Outcome], Any] | None = None) -> Outcome:
        """Decide one message (see the module docstring). With *resume* (which decides the
        message again, without holding it), a denied message may be held instead of parked.
        With *later*, the admission call may be answered on the event loop: the result is
        then :attr:`Outcome.ASKED` and the outcome goes to *later* when the reply comes."""
        headers = message.headers or {}
        early = self._early.get(message.delivery_tag) if later is not None else None
        loop = self._on_loop() if early is not None else None
        try:
            if early is not None and loop is not None and later is not None:
                # Asked for already (early.py), in this turn of the loop, after the checks
                # _decide makes (no future ETA, not running or asked for here): take the reply.
                return self._ask(loop, message, task, headers, early.opts, ack, resume, later)
            opts, pending = read_options(headers, task), read_acquire(headers)
            if opts is None and not pending:
                return Outcome.UNGATED
            return self._decide(message, task, headers, opts, pending, ack, resume, later)
        except BackendUnavailableError as exc:
            return self._defer("admission backend", exc)
        except ParkingUnavailableError as exc:
            # A waiter stays in line; the message stays unacked and comes back to us.
            return self._defer("parking database", exc)

    def _decide(self, message: Any, task: Any, headers: dict[str, Any], opts: FlowOptions | None,
                pending: dict[str, tuple[float, str]], ack: Callable[[], Any],
                resume: Callable[[], Any] | None = None,
                later: Callable[[Outcome], Any] | None = None) -> Outcome:
        now = self.clock()
        if opts is not None and opts.expires is not None and opts.expires < now:
            # Expired (often in the parking table, which wakes a row at its expiry): Celery
            # marks it REVOKED, as it does any expired task, and it takes no slot. Out of
            # line first, or a grant made to it would wait for grant_ttl.
            self.withdraw(message, task)
            return Outcome.UNGATED
        if opts is not None and opts.eta is not None and opts.eta > now + ETA_SLACK:
            return self._park(message, task, opts.queue, opts, opts.eta, "eta", ack)
        task_id = str(headers.get("id"))
        if opts is not None and self._taken(opts.queue, ticket_id(headers)):
            # Another delivery of this very message is admitted (or being asked for) here and
            # not finished (the broker redelivered what a dropped channel left unacked, while
            # the first copy still waits in the pool). Admission would give both the one slot
            # they share, and they would run side by side: this copy waits, unacked, until the
            # first settles.
            logger.info("flowcontrol: task %s is delivered again while its first delivery "
                        "runs here; it waits for that one to finish", task_id)
            return Outcome.DEFER
        if opts is None:
            return self._decided(message, task, headers, None, pending, ack, resume, None)
        loop = self._on_loop() if later is not None and not pending else None
        if loop is not None and later is not None:
            return self._ask(loop, message, task, headers, opts, ack, resume, later)
        decision = self._admit(task, opts.queue, ticket_id(headers), opts.priority, opts.key,
                               opts.label)
        return self._decided(message, task, headers, opts, pending, ack, resume, decision)

    def _ask(self, loop: EventLoopCalls, message: Any, task: Any, headers: dict[str, Any],
             opts: FlowOptions, ack: Callable[[], Any], resume: Callable[[], Any] | None,
             later: Callable[[Outcome], Any]) -> Outcome:
        """Send the admission call on the event loop (or take the one sent early); its reply
        decides (:meth:`_answered`): now if it is in, else when it comes."""
        early = self._early.pop(message.delivery_tag, None)
        if early is not None:
            if early.result is PENDING:
                loop.poll()
            if early.result is not PENDING:  # in already: decided in this turn
                return self._answered(loop, message, task, headers, opts, ack, resume,
                                      early.ticket.task_id, early.result) or Outcome.ASKED
            ticket = early.ticket
            tid = ticket.task_id
        else:
            tid = ticket_id(headers)
            try:
                ticket = Ticket(opts.queue, tid, self.instance, opts.priority, opts.key,
                                opts.label)
            except InvalidTicketError:  # the waiting path warns and runs it ungated
                return self._decided(message, task, headers, opts, {}, ack, resume,
                                     self._admit(task, opts.queue, tid, opts.priority,
                                                 opts.key, opts.label))
        asking = (opts.queue, tid)
        self._asking.add(asking)  # a second delivery meanwhile waits (as for a running one)

        def hand_over(result: Decision | FlowControlError) -> None:
            self._asking.discard(asking)
            outcome = self._answered(loop, message, task, headers, opts, ack, resume, tid,
                                     result)
            if outcome is not None:
                later(outcome)

        if early is None:
            loop.admit(ticket, hand_over)
        else:
            early.then = hand_over
        return Outcome.ASKED

    def _answered(self, loop: EventLoopCalls, message: Any, task: Any, headers: dict[str, Any],
                  opts: FlowOptions, ack: Callable[[], Any], resume: Callable[[], Any] | None,
                  tid: str, result: Decision | FlowControlError) -> Outcome | None:
        """The outcome of an admission asked on *loop* whose reply is *result*; ``None`` if
        the consumer stopped meanwhile (the message goes back to the broker unrun)."""
        if self._loop is not loop:
            if isinstance(result, Admitted):
                self.release(result.slot.slot_id)
            return None
        try:
            decision: Decision | None
            if isinstance(result, (UnknownQueueError, InvalidTicketError)):
                # Rare: the waiting path re-creates a lost queue, or warns and runs it.
                decision = self._admit(task, opts.queue, tid, opts.priority, opts.key,
                                       opts.label)
            elif isinstance(result, FlowControlError):
                raise result
            else:
                decision = result
            return self._decided(message, task, headers, opts, {}, ack, resume, decision)
        except BackendUnavailableError as exc:
            return self._defer("admission backend", exc)
        except ParkingUnavailableError as exc:
            return self._defer("parking database", exc)
        except Exception:
            # A bug must not lose the message: it stays unacked and is tried again.
            logger.exception("flowcontrol: admission of task %s failed; retrying later",
                             headers.get("id"))
            return Outcome.DEFER

    def _decided(self, message: Any, task: Any, headers: dict[str, Any], opts: FlowOptions | None,
                 pending: dict[str, tuple[float, str]], ack: Callable[[], Any],
                 resume: Callable[[], Any] | None, decision: Decision | None) -> Outcome:
        """Act on the queue's *decision* (``None``: not flow-controlled), then take the slots
        of *pending* ``acquire_slot`` calls; RUN when the message may run now."""
        now = self.clock()
        task_id = str(headers.get("id"))
        admission = Admission()
        priority, key = (opts.priority, opts.key) if opts else (0, task_id)
        if opts is not None:
            if isinstance(decision, Denied):
                # Never hold a message whose row waits parked (a redelivery after a crash
                # between commit and ack): run from the hold, it would leave that row to be
                # woken later and run a second time. The park path meets the row and acks.
                # A row being woken is this message's own (republished just before the
                # waker deletes it): that one may be held. One read by primary key, on the
                # deny path only.
                if (resume is not None and decision.reason == CONCURRENCY and not pending
                        and not self.store.waiting(task_id, self.clock())
                        and self.holds.add(ticket_id(headers), opts.queue, resume)):
                    self._recovered()
                    return Outcome.HELD
                return self._park(message, task, opts.queue, opts, decision.retry_at,
                                  decision.reason, ack)
            if decision is None and not pending:
                return Outcome.UNGATED
            if decision is not None:
                self.holds.moved(opts.queue)  # its line is active: a denial next may be held
                admission.primary = decision.slot.slot_id
                admission.entries.append(self._entry(decision.slot))
        for queue, (deadline, label) in pending.items():
            tid = acquire_ticket(task_id, queue)
            decision = self._admit(task, queue, tid, priority, key, label)
            if decision is None:
                admission.unknown.append(queue)
            elif isinstance(decision, Admitted):
                admission.acquired[queue] = decision.slot.slot_id
                admission.entries.append(self._entry(decision.slot))
            elif now >= deadline:
                self.backend.withdraw(queue, tid)
                admission.expired.append(queue)
            else:
                # A parked task holds nothing: give back every slot this decision took (its
                # queue's and those of earlier acquire_slot calls); the next run asks again.
                for entry in admission.entries:
                    self.release(entry.slot.slot_id)
                return self._park(message, task, queue, opts, min(decision.retry_at, deadline),
                                  "acquire", ack)
        self._recovered()
        self.ledger.add((task_id, message.delivery_tag), admission)
        self.admitted += 1
        return Outcome.RUN

    def withdraw(self, message: Any, task: Any) -> None:
        """Take a revoked message's tickets out of line (best effort: a lost waiter is
        pruned after waiter_ttl anyway)."""
        headers = message.headers or {}
        opts = read_options(headers, task)
        task_id = str(headers.get("id"))
        tickets = [(q, acquire_ticket(task_id, q)) for q in read_acquire(headers)]
        if opts is not None:
            tickets.append((opts.queue, ticket_id(headers)))
        for queue, ticket in tickets:
            try:
                self.backend.withdraw(queue, ticket)
            except FlowControlError:
                pass

    def _admit(self, task: Any, queue: str, tid: str, priority: int, key: str,
               label: str) -> Decision | None:
        """One admission call; ``None`` for a queue nobody registered, or for input the
        backend can't take (both run ungated, with one warning)."""
        try:
            ticket = Ticket(queue, tid, self.instance, priority, key, label)
            return self.backend.try_admit(ticket)
        except UnknownQueueError:
            # A flow_group's or serial task's queue (removed when idle), or a configured queue
            # whose state the backend lost (a Redis restart without persistence): re-create
            # it, so the cap holds again from this admission on.
            config = ephemeral_config(ticket.queue) or self._config_of(ticket.queue)
            if config is not None:
                # Through restore: its slot ids start past any held from before the loss,
                # and what this instance holds there counts again at once.
                restore_queue(self.backend, self.instance, config, self.ledger)
                return self.backend.try_admit(ticket)
            warn_once("queue", ticket.queue, "flow queue %r is not registered: tasks naming it "
                      "run ungated", ticket.queue)
        except InvalidTicketError as exc:
            warn_once("ticket", str(task.name), "task %s can't be flow-controlled (%s): "
                      "running ungated", task.name, exc)
        return None

    def _entry(self, slot: Slot) -> Entry:
        config = self._config_of(slot.queue)
        return Entry(slot, config is not None and config.release == "manual")

    def _park(self, message: Any, task: Any, queue: str, opts: FlowOptions | None,
              wake_at: float, reason: str, ack: Callable[[], Any]) -> Outcome:
        headers = message.headers or {}
        task_id = str(headers.get("id"))
        parked = parked_of(message, task_id=task_id, queue=queue, task_name=str(task.name),
                           priority=opts.priority if opts else 0,
                           key=opts.key if opts else None, wake_at=wake_at, reason=reason,
                           now=self.clock())
        try:
            if not self._park_once(parked):
                # The republished copy of a row a waker has not deleted yet: acking it now
                # would let that delete lose the message. Try again in a moment.
                return Outcome.DEFER
        except ParkingRejectedError as exc:
            return self._dead_letter(parked, exc, ack)
        self._recovered()
        ack()  # only now: the row is committed
        self.parked += 1
        self.waker.parked(task_id)
        return Outcome.PARKED

    def _dead_letter(self, parked: ParkedMessage, exc: ParkingRejectedError,
                     ack: Callable[[], Any]) -> Outcome:
        """Not an outage: this message can never be parked. Keep it in the dead-letter table
        (visible to operators) rather than loop on it; ack only once it is stored there."""
        logger.error("flowcontrol: task %s can't be parked (%s): dead-lettered",
                     parked.task_id, exc)
        self.store.dead_letter(parked, "park-rejected", exc)
        try:
            self.backend.withdraw(parked.queue, ticket_id(parked.headers))
        except FlowControlError:
            pass  # not waiting there (or not registered): nothing to take out of line
        self._recovered()
        ack()
        return Outcome.PARKED

    def _park_once(self, parked: ParkedMessage) -> bool:
        """Store *parked* unless its row is already stored; False if the row is one a waker
        is republishing right now (this message is its copy: it must not be acked yet)."""
        for _ in range(3):
            if self.store.park(parked):
                return True
            row = self.store.get(parked.task_id)
            if row is None:
                continue  # the waker deleted the row this copy came from: store it again
            # A waiting row: this is a redelivery of what is stored already (acking is safe).
            return not self._woken(row)
        return False

    def _woken(self, row: ParkedMessage) -> bool:
        """True if a waker holds *row*'s lease (it is republishing it, then deletes it)."""
        return (row.claimed_until or 0.0) > self.clock()

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
        """A message settled (result, failure, retry, revoke...): release its slots once."""
        admission = self.ledger.pop((task_id, delivery_tag))
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
        loop = self._on_loop()
        # On the loop only in a quiet queue: where waiters are, the grant this release makes
        # goes to a waiter held here at once, on this thread, and that hand-over is the
        # latency of the whole line.
        if loop is not None and queue is None:
            queue = queue_of_slot(slot_id)
        if loop is not None and queue is not None and loop.quiet(queue):
            def released(result: bool | FlowControlError) -> None:
                if isinstance(result, FlowControlError):
                    self._release_failed(slot_id, result)
                elif then is not None:
                    then()

            loop.release(slot_id, released)
            return
        try:
            self.backend.release(slot_id)
        except FlowControlError as exc:
            self._release_failed(slot_id, exc)
            return
        if then is not None:
            then()

    def _release_failed(self, slot_id: str, exc: FlowControlError) -> None:
        logger.warning("flowcontrol: release of %s failed (%s); retrying", slot_id, exc)
        self.waker.retry_release(slot_id)

    def _forget(self, queue: str) -> None:
        try:
            self.backend.unregister(queue, only_if_idle=True)
        except FlowControlError:
            pass  # it stays until a later member finishes; harmless

    def settle_dropped(self, pool: Any) -> int:
        """After a broker reconnect (the bootstep calls it as the consumer starts again):
        release the slots of what Celery dropped unrun with the lost connection
        (request.py's :func:`will_settle`). No hook of theirs would ever run: their slots
        would stay held for good (re-asserted by the heartbeat), and the broker's second
        delivery of each would wait here for a first one that never finishes. How many."""
        dropped = [key for key, admission in self.ledger.items()
                   if admission.request is not None
                   and not will_settle(admission.request, pool)]
        for task_id, delivery_tag in dropped:
            self.finish(task_id, delivery_tag)
        if dropped:
            logger.warning("flowcontrol: %d admitted task(s) dropped unrun with the lost broker "
                           "connection; their slots are released and the broker delivers them "
                           "again", len(dropped))
        return len(dropped)

    def admission_of(self, task_id: str, delivery_tag: Any) -> Admission | None:
        """What an admitted message holds (for FlowRequest to hand to the task)."""
        return self.ledger.get((task_id, delivery_tag))

    def close(self) -> None:
        """Warm shutdown: release what was admitted but never finished."""
        self.detach_loop()
        for entry in self.ledger.drain():
            if not entry.manual:
                self.release(entry.slot.slot_id)

    def stats(self) -> dict[str, Any]:
        """This instance's admission figures."""
        return {"instance": self.instance, "held": self.ledger.held(),
                "admitted": self.admitted, "parked": self.parked, "woken": self.waker.woken,
                "waiting_here": len(self.holds), "handed_over": self.holds.handed}

