"""Busy slots as operators see them: who holds each one, for which task, since when."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..admission.values import Slot, queue_of_slot
from .clock import backend_now

__all__ = ["SlotRow", "slot_rows", "seq_of", "queue_of_slot"]


def seq_of(slot_id: str) -> int:
    """The per-queue sequence number of a slot id ``"<queue>:<n>"`` (0 if it has none)."""
    tail = slot_id.rpartition(":")[2]
    return int(tail) if tail.isdigit() else 0


@dataclass(frozen=True)
class SlotRow:
    """A busy slot as operators see it: who holds it, for which task, since when."""

    slot_id: str
    holder: str
    task_id: str
    fairness_key: str
    label: str
    acquired_at: float
    age: float
    expires_at: float | None
    expires_in: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def slot_rows(fc: Any, name: str, now: Callable[[], float] | None = None) -> list[SlotRow]:
    """Busy slots of *name*, oldest first."""
    t = now() if now is not None else backend_now(fc)
    slots: list[Slot] = fc.backend.busy_slots(name)
    return [SlotRow(s.slot_id, s.holder, s.task_id, s.fairness_key, s.label, s.acquired_at,
                    max(0.0, t - s.acquired_at), s.expires_at,
                    None if s.expires_at is None else s.expires_at - t) for s in slots]
