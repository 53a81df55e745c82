"""Calls that collapse as operators see them: the unique keys held now and the debounced
calls pending (one per burst, with the burst's last arguments and how many calls it took in)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..collapse.wiring import claims_of, debounce_rows_of
from ..protocol import read_burst

__all__ = ["DebounceRow", "UniqueRow", "collapsed"]


@dataclass(frozen=True)
class UniqueRow:
    """A held unique key: the call holding it and the seconds its claim has left."""

    key: str
    task_id: str
    ttl: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


@dataclass(frozen=True)
class DebounceRow:
    """A burst's pending call: its task id, key, calls so far, arguments and when it runs."""

    task_id: str
    task_name: str
    key: str
    calls: int
    args: str
    first_at: float | None
    wake_at: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def collapsed(fc: Any, limit: int = 100) -> tuple[list[UniqueRow], list[DebounceRow]]:
    """Up to *limit* held unique keys (by key) and pending debounces (soonest first)."""
    unique = [UniqueRow(h.collapse_key, h.task_id, h.ttl) for h in claims_of(fc.app).held("unique", limit)]
    pending = []
    for m in debounce_rows_of(fc.app).pending(limit):
        burst = read_burst(m.headers) or {}
        args = ", ".join(str(m.headers.get(k) or "") for k in ("argsrepr", "kwargsrepr")
                         if m.headers.get(k) not in (None, "", "{}", "()"))
        pending.append(DebounceRow(m.task_id, m.task_name, str(burst.get("key") or m.task_name),
                                   int(burst.get("calls") or 1), args[:200],
                                   burst.get("first"), m.wake_at))
    return unique, pending
