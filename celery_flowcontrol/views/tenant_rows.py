"""The tenants of a queue: its busiest fairness keys, changing one, pausing (``flowcontrol
keys``, ``key``, ``pause``, ``resume``, the dashboard's tenants page).

One row per key the backend reports (``AdmissionBackend.key_stats``: the busiest by busy plus
waiting): busy, waiting, weight, its caps, whether it is paused, and its share of the last
minute's admissions among the keys shown. The text forms are shared by the CLI and the dashboard.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..admission.values import KeyStats
from ..config import as_tuple
from ..errors import FlowControlConfigError
from ..tenants import key_changes, pause_end, wake_paused
from .changes import parse_rate_text
from .clock import backend_now
from .queues import limit_text
from .text import duration, when

__all__ = ["KeyRow", "key_rows", "pause", "paused_text", "reset_key", "resume", "set_key_text"]


def paused_text(until: float | None, now: float) -> str:
    """``"-"`` (not paused), ``"until resumed"``, or ``"until 12:00:05 (4m05s)"``."""
    if until is None or until <= now:
        return "-"
    if math.isinf(until):
        return "until resumed"
    return f"until {when(until)} ({duration(until - now)})"


@dataclass(frozen=True)
class KeyRow:
    """One tenant of a queue, as ``keys`` and the tenants page show it."""

    key: str
    busy: int
    waiting: int
    weight: float
    concurrency: int | None
    rate_limit: str | None
    reserve: int | None
    max_waiting: int | None
    paused_until: float | None  # None: not paused; inf: until resumed
    admitted_recent: int
    share: float  # of the last minute's admissions of the keys shown, 0..1
    overridden: bool
    paused: str = "-"  # paused_until as text

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (an open-ended pause's ``paused_until`` is ``null`` with ``paused``
        saying so: JSON has no infinity)."""
        data = asdict(self)
        if self.paused_until is not None and math.isinf(self.paused_until):
            data["paused_until"] = None
        return data


def _row(s: KeyStats, total: int, now: float) -> KeyRow:
    rates = as_tuple(s.rate_limit)
    paused = s.paused_until if s.paused_until is not None and s.paused_until > now else None
    return KeyRow(key=s.key, busy=s.busy, waiting=s.waiting, weight=s.weight,
                  concurrency=s.concurrency,
                  rate_limit=", ".join(limit_text(r) for r in rates) or None,
                  reserve=s.reserve, max_waiting=s.max_waiting, paused_until=paused,
                  admitted_recent=s.admitted_recent,
                  share=s.admitted_recent / total if total else 0.0, overridden=s.overridden,
                  paused=paused_text(paused, now))


def key_rows(fc: Any, name: str, limit: int = 20) -> list[KeyRow]:
    """The busiest *limit* keys of queue *name* (:class:`UnknownQueueError` if unknown)."""
    stats: list[KeyStats] = fc.backend.key_stats(name, limit)
    total = sum(s.admitted_recent for s in stats)
    now = backend_now(fc)
    return [_row(s, total, now) for s in stats]


def set_key_text(fc: Any, name: str, key: str, values: dict[str, Any]) -> Any:
    """Override *key*'s fields of queue *name* from an operator's text (``rate_limit`` as
    ``flowcontrol rate`` reads it: ``"60/m"``, several, or JSON); the key's settings now.
    Through the backend's own API, as every operator action (changes.py)."""
    given = key_changes(name, key, values)
    if isinstance(given.get("rate_limit"), str):
        try:
            given["rate_limit"] = parse_rate_text(name, given["rate_limit"])
        except FlowControlConfigError as exc:
            raise FlowControlConfigError(exc.detail, name, f"keys[{key!r}].rate_limit") from None
        if given["rate_limit"] is None:
            raise FlowControlConfigError("'reset' resets the whole key: `key QUEUE KEY reset`",
                                         name, f"keys[{key!r}].rate_limit")
    return fc.backend.set_key(name, key, **given)


def reset_key(fc: Any, name: str, key: str) -> None:
    """Drop every run-time override of *key* in queue *name*."""
    fc.backend.reset_key(name, key)


def pause(fc: Any, name: str, key: str | None, until: Any) -> float | None:
    """Pause queue *name* (or its *key*) until *until* (``tenants.pause_until``'s forms); the
    instant it ends, or ``None`` until resumed."""
    at = pause_end(fc.app, name, until)
    fc.backend.pause(name, key, at)
    return at


def resume(fc: Any, name: str, key: str | None) -> None:
    """End a pause of queue *name* (or of its *key*), and make the calls it parked due."""
    fc.backend.resume(name, key)
    wake_paused(fc, name, key)
