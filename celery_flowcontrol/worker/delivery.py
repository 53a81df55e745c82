"""One message on its way through the gate, and what the gate decided for it.

A :class:`Delivery` is what the strategy hands the gate for each message (the message, its
task, its headers, how to ack it, how to decide it again, where a later outcome goes) plus
what the gate reads from it once (the flow options and the slots ``acquire_slot`` waits for),
so each step of the decision takes one value instead of the same eight arguments.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..protocol import FlowOptions, ticket_id

__all__ = ["Delivery", "Outcome"]


class Outcome(enum.Enum):
    """What becomes of a message the gate decided."""

    RUN = "run"          # admitted: hand to the pool
    UNGATED = "ungated"  # not flow-controlled (or expired, for Celery to revoke): to the pool
    PARKED = "parked"    # stored and acked: done here
    LINGERING = "lingering"        # denied, kept unacked until its grant comes (linger.py)
    DEFER = "defer"      # a service is down: try this message again later
    ASKED = "asked"      # on the event loop: the outcome comes later, to ``later``


@dataclass(slots=True, eq=False)
class Delivery:
    """A message the gate decides (see the module docstring)."""

    message: Any
    task: Any
    headers: dict[str, Any]
    ack: Callable[[], Any]
    #: Decides the message again, without letting it linger (a lingering waiter's grant, or its bound).
    resume: Callable[[], Any] | None = None
    #: Takes the outcome of an admission answered on the event loop.
    later: Callable[[Outcome], Any] | None = None
    opts: FlowOptions | None = None
    pending: dict[str, tuple[float, str]] = field(default_factory=dict)

    @property
    def task_id(self) -> str:
        return str(self.headers.get("id"))

    @property
    def ticket(self) -> str:
        """The waiter identity of this delivery in its flow queue (protocol.ticket_id)."""
        return ticket_id(self.headers)
