"""Durations, instants and caps as operators read them, in the CLI's tables and on the dashboard."""

from __future__ import annotations

import datetime as dt
import math

__all__ = ["duration", "when", "capacity_text", "max_hold_text"]


def duration(seconds: float | None) -> str:
    """``"3.2s"``, ``"4m05s"``, ``"2h10m"``, ``"3d4h"``; ``"-"`` for none."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 60:
        return f"{sign}{s:.1f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{sign}{int(s // 86400)}d{int(s % 86400 // 3600)}h"


def when(epoch: float | None) -> str:
    """An epoch time as UTC ``HH:MM:SS`` (today) or ``YYYY-MM-DD HH:MM:SS``."""
    if epoch is None:
        return "-"
    t = dt.datetime.fromtimestamp(epoch, dt.timezone.utc)
    today = dt.datetime.now(dt.timezone.utc).date()
    return t.strftime("%H:%M:%S" if t.date() == today else "%Y-%m-%d %H:%M:%S")


def capacity_text(capacity: int | None, override: int | None) -> str:
    """The capacity, ``"unlimited"`` when unlimited, with ``*`` when it is an operator override."""
    text = "unlimited" if capacity is None else str(capacity)
    return text + ("*" if override is not None else "")


def max_hold_text(seconds: float | None, override: float | None) -> str:
    """The max hold as a duration, with ``*`` when it is an operator override."""
    return duration(seconds) + ("*" if override is not None else "")
