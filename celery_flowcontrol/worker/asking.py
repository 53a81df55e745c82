"""Admission calls answered on the consumer's event loop, so the loop goes on meanwhile.

Where the backend can (``AdmissionBackend.on_event_loop``: Redis with the prefork pool), the
gate sends a fresh delivery's admission call without waiting, and decides the message when the
reply comes (:meth:`LoopAsks.ask`), or in the same turn when it is in already. On a virtual
transport the call is sent even earlier, before kombu's own round trip for the message
(early.py; :meth:`LoopAsks.ask_early`), and the reply is taken when the strategy asks.

A reply that comes after the consumer stopped (a broker reconnect) finds its loop detached: the
message goes back to the broker unrun, so a slot it was given is released.

The parts talk through narrow interfaces: the loop is the :class:`~.consumer_loop.ConsumerLoop`
the releaser reads too, a slot is given back through :class:`Releases`, and a reply is decided
by :class:`Replies` (the gate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..admission.base import AdmissionBackend, Admitted, Decision, Denied, EventLoopCalls, Ticket
from ..errors import CostRefusedError, FlowControlError, InvalidTicketError
from ..protocol import QUEUE_HEADER, read_acquire, read_options, ticket_id
from .consumer_loop import ConsumerLoop
from .delivery import Delivery, Outcome
from .early import PENDING, Early
from .ledger import Ledger
from .release import Releases

#: A message whose ETA is less than this far ahead is not worth parking.
ETA_SLACK = 0.05


class Replies(Protocol):
    """Decides a delivery on the reply to its admission call (the gate)."""

    def replied(self, d: Delivery, tid: str, result: Decision | FlowControlError) -> Outcome:
        """The outcome of *d*, whose call for ticket id *tid* got *result*."""


class LoopAsks:
    """The admission calls one worker instance has on the consumer's event loop."""

    replies: Replies  # who decides each reply (the gate)

    def __init__(self, *, backend: AdmissionBackend, instance: str, ledger: Ledger,
                 clock: Callable[[], float], loop: ConsumerLoop, releases: Releases,
                 replies: Replies | None = None) -> None:
        self.backend = backend
        self.instance = instance
        self.ledger = ledger
        self.clock = clock
        self.loop = loop
        self.releases = releases
        if replies is not None:  # else given by answer_to, once the gate is built
            self.replies = replies
        self._asking: set[tuple[str, str]] = set()  # (queue, ticket) asked on the loop
        self._early: dict[Any, Early] = {}  # by delivery tag: asked early (early.py)

    def answer_to(self, replies: Replies) -> None:
        """Hand each reply to *replies* (the gate: built after the parts it decides with)."""
        self.replies = replies

    def attach(self, hub: Any) -> None:
        """From now on, ask and release on *hub* (the consumer's event loop, this thread)
        without waiting, when the backend can. The bootstep calls it on every consumer
        start."""
        self.detach()
        self.loop.attach(hub)

    def detach(self) -> None:
        """Back to waiting calls. Replies still due are waited for briefly and handed over;
        a message admitted meanwhile does not run (its channel is closing: the broker
        delivers it again), so its slot is released."""
        loop = self.loop.detach()
        if loop is not None:
            loop.close()  # an early reply nobody took is undone meanwhile
        self._asking.clear()
        self._early.clear()

    @property
    def attached(self) -> bool:
        """True while admission calls are answered on the event loop."""
        return self.loop.calls is not None

    @property
    def calls(self) -> EventLoopCalls | None:
        """The event loop's calls while attached, or None."""
        return self.loop.calls

    def current(self) -> EventLoopCalls | None:
        """The loop's calls, when called on the loop's own thread."""
        return self.loop.current()

    def taken(self, queue: str, ticket: str) -> bool:
        """True if a delivery here holds *ticket* of *queue* (admitted, not finished) or is
        being asked for it on the loop."""
        return self.ledger.running(queue, ticket) or (queue, ticket) in self._asking

    def early(self, delivery_tag: Any) -> Early | None:
        """The early call of a delivery, if one was sent for it."""
        return self._early.get(delivery_tag)

    def forget_early(self, delivery_tag: Any) -> None:
        """The gate decides this delivery without asking (a twin, twins.py): an early call
        sent for it is undone as one whose message never asked (early.py), now if its reply
        is in, else when it comes."""
        early = self._early.get(delivery_tag)
        if early is not None and early.result is not PENDING:
            del self._early[delivery_tag]
            self._undo(early.ticket, early.result)

    def ask_early(self, message: Any, task: Any) -> None:
        """Send *message*'s admission call now, before kombu's own round trip for it, when
        the strategy will ask for it on the loop and its queue is quiet (early.py)."""
        loop = self.current()
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
        if self.taken(opts.queue, tid):
            return
        try:
            ticket = Ticket(opts.queue, tid, self.instance, opts.priority, opts.key, opts.label,
                            opts.cost)
        except (InvalidTicketError, CostRefusedError):
            return  # the waiting path decides it (warns and runs it, or dead-letters it)
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

    def ask(self, loop: EventLoopCalls, d: Delivery) -> Outcome:
        """Send *d*'s admission call on *loop* (or take the one sent early); the reply decides:
        now if it is in, else when it comes (to ``d.later``)."""
        opts = d.opts
        assert opts is not None and d.later is not None
        later = d.later
        early = self._early.pop(d.message.delivery_tag, None)
        if early is not None:
            if early.result is PENDING:
                loop.poll()
            if early.result is not PENDING:  # in already: decided in this turn
                return self._answer(loop, d, early.ticket.task_id, early.result) \
                    or Outcome.ASKED
            ticket = early.ticket
            tid = ticket.task_id
        else:
            tid = d.ticket
            try:
                ticket = Ticket(opts.queue, tid, self.instance, opts.priority, opts.key,
                                opts.label, opts.cost)
            except (InvalidTicketError, CostRefusedError) as exc:  # decided as a reply
                return self.replies.replied(d, tid, exc) or Outcome.DEFER
        self.ledger.asked(opts.queue)  # a slot or a waiter of ours there (holdings.py)
        asking = (opts.queue, tid)
        self._asking.add(asking)  # a second delivery meanwhile waits (as for a running one)

        def hand_over(result: Decision | FlowControlError) -> None:
            self._asking.discard(asking)
            outcome = self._answer(loop, d, tid, result)
            if outcome is not None:
                later(outcome)

        if early is None:
            loop.admit(ticket, hand_over)
        else:
            early.then = hand_over
        return Outcome.ASKED

    def _answer(self, loop: EventLoopCalls, d: Delivery, tid: str,
                result: Decision | FlowControlError) -> Outcome | None:
        """The outcome of an admission asked on *loop*; ``None`` if the consumer stopped
        meanwhile (the message goes back to the broker unrun)."""
        if self.loop.calls is not loop:
            if isinstance(result, Admitted):
                self.releases.release(result.slot.slot_id)
            return None
        return self.replies.replied(d, tid, result)

    def _undo(self, ticket: Ticket, result: Decision | FlowControlError) -> None:
        """Take back an early admission whose message never asked (early.py), unless this
        worker holds that ticket another way (admission is idempotent by ticket)."""
        if self.taken(ticket.queue, ticket.task_id):
            return
        if isinstance(result, Admitted):
            self.releases.release(result.slot.slot_id)
        elif isinstance(result, Denied):
            try:
                self.backend.withdraw(ticket.queue, ticket.task_id)
            except FlowControlError:
                pass  # a lost waiter is pruned after waiter_ttl
