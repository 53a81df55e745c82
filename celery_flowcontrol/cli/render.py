"""Plain-text tables and figures for the ``celery flowcontrol`` command (no dependencies)."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["table", "duration", "when", "to_json", "capacity_text", "max_hold_text"]


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


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    # One line per row, whatever a label holds: control characters are shown, not obeyed.
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(value))


def _numeric(text: str) -> bool:
    core = text.rstrip("*")
    return bool(core) and core.replace(".", "", 1).replace("/", "", 1).isdigit()


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A left-aligned text table with a header line; numbers are right-aligned."""
    text_rows = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if _numeric(c) else c.ljust(w)
                         for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out.extend(line(r) for r in text_rows)
    return "\n".join(out)


def to_json(value: Any) -> str:
    """Indented JSON with sorted keys (what ``--json`` prints)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)
