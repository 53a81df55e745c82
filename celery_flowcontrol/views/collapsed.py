"""Calls that collapse as operators see them: the unique keys held now, the debounced
calls pending (one per burst, with the burst's last arguments and how many calls it took in)
the batches gathering (``flow_batch``: key, calls so far, the oldest call's age) and the
latest-wins keys (``flow_unique_keep="latest"``: the newest call, the call running now)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from ..collapse.wiring import claims_of, debounce_rows_of, latest_of
from ..engines import engines_of
from ..parking.batches import BatchRows
from ..protocol import read_burst

__all__ = ["BatchRow", "DebounceRow", "LatestRow", "UniqueRow", "collapsed", "gathering",
           "latest_keys"]


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


@dataclass(frozen=True)
class BatchRow:
    """A batch gathering: its batch key, the calls waiting so far, the oldest one's age (s)."""

    key: str
    calls: int
    oldest_age: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


@dataclass(frozen=True)
class LatestRow:
    """A latest-wins key: its newest call, the call running now (``None``: none), whether the
    newest call's run ended, and the seconds the key has left."""

    key: str
    latest: str
    running: str | None
    done: bool
    ttl: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


def latest_keys(fc: Any, limit: int = 100) -> list[LatestRow]:
    """Up to *limit* latest-wins keys, by key."""
    return [LatestRow(h.collapse_key, h.latest, h.running, h.done, h.ttl)
            for h in latest_of(fc.app).held(limit)]


def gathering(fc: Any, limit: int = 100, now: float | None = None) -> list[BatchRow]:
    """Up to *limit* ``flow_batch`` keys with calls waiting for a batch, oldest first."""
    now = time.time() if now is None else now
    rows = BatchRows(engines_of(fc.app).store).gathering_keys(limit)
    return [BatchRow(key, calls, max(0.0, now - oldest)) for key, calls, oldest in rows]


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
