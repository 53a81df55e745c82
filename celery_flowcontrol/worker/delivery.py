"""One message on its way through the gate, and what the gate decided for it.

A :class:`Delivery` is what the strategy hands the gate for each decision of a message (the
message, its task, its headers, how to ack it, how to decide it again, where a later outcome
goes) plus what the gate reads from it once (the flow options and the slots ``acquire_slot``
waits for), so each step of the decision takes one value instead of the same eight arguments.

One broker delivery may be decided more than once: again after an outage (``DEFER``), when a
lingering waiter resumes, when its admission reply comes on the loop. Every decision of it
shares one :class:`DeliveryState`, the one owner of its fate and of its ack: once a decision
ran it, parked it or let it through, a later decision of the same delivery is refused before it
does anything (``Outcome.DECIDED``), and the delivery is acked at most once. A second ack would
raise kombu's ``MessageStateError`` on the consumer's loop and stop the worker; a second park
would leave a row that runs the task again.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..protocol import FlowOptions, ticket_id

__all__ = ["Delivery", "DeliveryState", "Outage", "Outcome", "decide_once"]

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """What becomes of a message the gate decided."""

    RUN = "run"          # admitted: hand to the pool
    UNGATED = "ungated"  # not flow-controlled (or expired, for Celery to revoke): to the pool
    PARKED = "parked"    # stored and acked: done here
    REFUSED = "refused"  # past a waiting bound: ended FAILURE in the result backend, acked
    LINGERING = "lingering"        # denied, kept unacked until its grant comes (linger.py)
    DEFER = "defer"      # a service is down: try this message again later
    ASKED = "asked"      # on the event loop: the outcome comes later, to ``later``
    DECIDED = "decided"  # decided already by another decision of this delivery: nothing to do


#: The outcomes after which a delivery is no longer the gate's: run, let through, parked or
#: refused.
FINAL = frozenset({Outcome.RUN, Outcome.UNGATED, Outcome.PARKED, Outcome.REFUSED})


@dataclass(slots=True)
class DeliveryState:
    """What became of one broker delivery, shared by every decision of it (module docstring).
    The strategy makes one per message it receives; all of it runs on the consumer's loop."""

    #: The final outcome (:data:`FINAL`) once one decision reached it, else ``None``.
    outcome: Outcome | None = None
    acked: bool = False

    def record(self, outcome: Outcome) -> Outcome:
        """Record *outcome* if it is final; return it."""
        if outcome in FINAL and self.outcome is None:
            self.outcome = outcome
        return outcome


@dataclass(slots=True, eq=False)
class Delivery:
    """A message the gate decides (see the module docstring)."""

    message: Any
    task: Any
    headers: dict[str, Any]
    #: Acks the message (Celery's: queued on the consumer's loop); called through :meth:`ack`.
    acker: Callable[[], Any]
    #: Decides the message again, without letting it linger (a lingering waiter's grant, or its bound).
    resume: Callable[[], Any] | None = None
    #: Takes the outcome of an admission answered on the event loop.
    later: Callable[[Outcome], Any] | None = None
    opts: FlowOptions | None = None
    pending: dict[str, tuple[float, str]] = field(default_factory=dict)
    state: DeliveryState = field(default_factory=DeliveryState)

    @property
    def task_id(self) -> str:
        return str(self.headers.get("id"))

    @property
    def ticket(self) -> str:
        """The waiter identity of this delivery in its flow queue (protocol.ticket_id)."""
        return ticket_id(self.headers)

    def ack(self) -> None:
        """Ack the message, once: a second ack is logged and skipped."""
        if self.state.acked:
            logger.error("flowcontrol: task %s: a second ack of one delivery is skipped",
                         self.task_id)
            return
        self.state.acked = True
        self.acker()


def decide_once(d: Delivery, decide: Callable[[Delivery], Outcome]) -> Outcome:
    """``decide(d)``, recorded on *d*'s delivery; refused (:attr:`Outcome.DECIDED`) without
    calling it if another decision of the delivery decided it for good already: nothing is asked,
    parked or acked again, and the refusal is logged (a path that decides twice is a bug)."""
    if d.state.outcome is not None:
        logger.error("flowcontrol: task %s was decided already (%s); a second decision of "
                     "its delivery is refused", d.task_id, d.state.outcome)
        return Outcome.DECIDED
    return d.state.record(decide(d))


class Outage:
    """A service the decisions need is unreachable: reported once, and once when it is back."""

    def __init__(self) -> None:
        self.what: str | None = None  # the service down, while one is

    def defer(self, what: str, exc: Exception) -> Outcome:
        """*what* failed with *exc*: the message stays unacked and is decided again later."""
        if self.what is None:
            logger.error("flowcontrol: %s unreachable (%s); messages stay in the broker and "
                         "are retried", what, exc)
        self.what = what
        return Outcome.DEFER

    def recovered(self) -> None:
        """A decision went through: the service is back, if one was down."""
        if self.what is not None:
            logger.warning("flowcontrol: %s reachable again", self.what)
            self.what = None
