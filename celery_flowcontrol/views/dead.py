"""Dead letters as operators see them, and the way back: requeue parks them anew, due now.

Shared by ``celery flowcontrol dead`` and the dashboard's dead-letter page. A requeued letter
leaves the dead-letter table; the next poll of any worker publishes its message, and its task
meets admission like a fresh arrival (parking/dead_letters.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import FlowControlConfigError
from ..parking import DeadLetter, Requeue
from ..parking.dead_letters import DeadLetterTable

__all__ = ["DeadRow", "Requeued", "dead_count", "dead_rows", "requeue"]


@dataclass(frozen=True)
class DeadRow:
    """A dead letter, without its message body."""

    id: int
    task_id: str
    task_name: str
    queue: str
    reason: str
    error: str
    created_at: float

    @classmethod
    def of(cls, d: DeadLetter) -> DeadRow:
        """The row of dead letter *d*."""
        return cls(d.id, d.task_id, d.message.task_name, d.queue, d.reason, d.error, d.created_at)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


@dataclass(frozen=True)
class Requeued:
    """One dead letter a requeue touched: parked anew (``refused`` is ``None``) or left with
    the reason."""

    row: DeadRow
    refused: str | None

    @classmethod
    def of(cls, r: Requeue) -> Requeued:
        """The view of store result *r*."""
        return cls(DeadRow.of(r.letter), r.refused)

    def text(self) -> str:
        """One line a person reads."""
        r = self.row
        what = f"dead letter {r.id} (task {r.task_id}, {r.task_name or '?'}, queue {r.queue})"
        if self.refused is None:
            return f"requeued {what}: parked, due now"
        return f"not requeued: {what}: {self.refused}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {**self.row.to_dict(), "requeued": self.refused is None, "refused": self.refused}


def dead_rows(fc: Any, limit: int = 50, queue: str | None = None) -> list[DeadRow]:
    """The *limit* newest dead letters (of *queue*, or of every queue), newest first."""
    return [DeadRow.of(d) for d in fc.store.dead_letters(limit, queue=queue)]


def dead_count(fc: Any, queue: str | None = None) -> int:
    """How many dead letters there are (of *queue*, or of every queue)."""
    return DeadLetterTable(fc.store).count(queue)


def requeue(fc: Any, ids: Sequence[int] = (), *, queue: str | None = None,
            every: bool = False) -> list[Requeued]:
    """Park dead letters anew, due now: those of *ids*, or of *queue*, or *every* one (exactly
    one of the three). ``UnknownDeadLetterError`` names ids that are not dead letters, and
    nothing is requeued then."""
    chosen = [name for name, given in (("ids", bool(ids)), ("queue", queue is not None),
                                       ("all", every)) if given]
    if len(chosen) != 1:
        raise FlowControlConfigError("give dead-letter ids, a queue, or all (exactly one of them), "
                                     f"got {' and '.join(chosen) or 'none'}", queue, "requeue")
    table = DeadLetterTable(fc.store)
    if ids:
        done = table.requeue(ids)
    else:
        done = table.requeue(queue=queue)
    return [Requeued.of(r) for r in done]
