"""Plain-text tables and JSON for the ``celery flowcontrol`` command (no dependencies).

Durations, instants and caps as text are shared with the dashboard: :mod:`celery_flowcontrol.views.text`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["table", "to_json"]


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
