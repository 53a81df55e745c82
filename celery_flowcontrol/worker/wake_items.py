"""The waker's work items: what its inbox holds, one dataclass each.

Anything may put an item in the waker's inbox (a grant's announcement, a park's commit, the
consumer's timer, a lingering waiter handed its grant); the waker's thread takes every item
queued by its next turn and gathers them into one :class:`Round` (each item says how, in
:meth:`WorkItem.into`), so that what came together is done together: grants woken in one
claim, the wake-ahead of a queue counted once, the chores run once.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from ..admission.base import Grant

__all__ = ["DUE", "STOP", "TICK", "Ahead", "Committed", "Due", "Granted", "Round", "Stop",
           "Tick", "WorkItem", "inbox"]


@dataclass
class Round:
    """What one turn of the waker does."""

    #: Grants announced for waiters of this instance: woken at once, in one claim.
    grants: list[Grant] = field(default_factory=list)
    #: Task ids whose park committed after their grant came: woken at once.
    committed: list[str] = field(default_factory=list)
    #: Queue -> how many waiters to wake ahead of their grant; None: as many as there is
    #: room for (a grant went through a parked row there).
    ahead: dict[str, int | None] = field(default_factory=dict)
    #: The periodic chores are due (chores.py).
    chores: bool = False


class WorkItem:
    """One item of the waker's inbox."""

    __slots__ = ()

    def into(self, r: Round) -> None:
        """Add this item to *r*."""


@dataclass(frozen=True, slots=True)
class Granted(WorkItem):
    """A slot granted to a waiter parked by this instance (or by nobody named)."""

    grant: Grant

    def into(self, r: Round) -> None:
        r.grants.append(self.grant)
        r.ahead[self.grant.queue] = None  # its line moved: as many ahead as there is room for


@dataclass(frozen=True, slots=True)
class Committed(WorkItem):
    """A park committed after its grant came (an orphan grant): wake the row now."""

    task_id: str

    def into(self, r: Round) -> None:
        r.committed.append(self.task_id)


@dataclass(frozen=True, slots=True)
class Ahead(WorkItem):
    """A lingering waiter of *queue* was handed its grant: wake *n* parked ones ahead."""

    queue: str
    n: int = 1

    def into(self, r: Round) -> None:
        if r.ahead.get(self.queue, 0) is not None:  # None: as many as room already
            r.ahead[self.queue] = (r.ahead.get(self.queue) or 0) + self.n


@dataclass(frozen=True, slots=True)
class Tick(WorkItem):
    """The consumer's timer ticked: the periodic chores."""

    def into(self, r: Round) -> None:
        r.chores = True


@dataclass(frozen=True, slots=True)
class Due(WorkItem):
    """Rows known here come due (waking.py): each turn looks at them anyway."""


@dataclass(frozen=True, slots=True)
class Stop(WorkItem):
    """The waker stops: it wakes up to see so."""


TICK = Tick()
DUE = Due()
STOP = Stop()


def inbox() -> queue.SimpleQueue[WorkItem]:
    """A waker's inbox: any thread puts, the waker's thread takes."""
    return queue.SimpleQueue()
