"""The waiters of a flow queue, in the order they will be served."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..admission.values import Waiter
from .clock import backend_now

__all__ = ["WaiterRow", "waiter_rows"]


@dataclass(frozen=True)
class WaiterRow:
    """A waiter, with its place in line (1 = served next)."""

    position: int
    task_id: str
    priority: int
    fairness_key: str
    label: str
    instance: str
    since: float
    age: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def waiter_rows(fc: Any, name: str, limit: int = 100,
                now: Callable[[], float] | None = None) -> list[WaiterRow]:
    """Up to *limit* waiters of *name* in the order they will be served."""
    t = now() if now is not None else backend_now(fc)
    waiters: list[Waiter] = fc.backend.waiters(name, limit)
    return [WaiterRow(i, w.task_id, w.priority, w.fairness_key, w.label, w.instance, w.since,
                      max(0.0, t - w.since)) for i, w in enumerate(waiters, 1)]
