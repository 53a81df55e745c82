"""Parked messages of a flow queue as operators see them: in wake order, without their bodies."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..parking import ParkedMessage

__all__ = ["ParkedRow", "parked_rows"]


@dataclass(frozen=True)
class ParkedRow:
    """A parked message, without its body."""

    task_id: str
    task_name: str
    priority: int
    fairness_key: str | None
    reason: str
    wake_at: float
    parked_at: float | None
    attempts: int

    @classmethod
    def of(cls, m: ParkedMessage) -> ParkedRow:
        """The row of parked message *m*."""
        return cls(m.task_id, m.task_name, m.priority, m.fairness_key, m.reason, m.wake_at,
                   m.parked_at, m.attempts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def parked_rows(fc: Any, name: str, limit: int = 50) -> list[ParkedRow]:
    """Up to *limit* parked messages of queue *name*, in wake order."""
    fc.backend.get_config(name)  # an unknown queue is an error, not an empty list
    return [ParkedRow.of(m) for m in fc.store.list(name, limit)]
