"""The dashboard's tenants page of a queue: its busiest fairness keys as ``flowcontrol keys``
shows them, a chart of admissions by key over the last minute, and Pause / Resume buttons for
the queue and each key (``/queues/<name>/keys``, ``/api/queues/<name>/keys``, ``POST
/queues/<name>/pause`` and ``/resume``). A pause or resume is a change: it needs the dashboard
token (an unlocked session with its CSRF token, or a bearer header), like every other change.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, flash, jsonify, redirect, render_template, request, session, url_for

from ..views.queues import queue_row
from ..views.tenant_rows import KeyRow, key_rows, pause, resume
from ..views.text import when
from .security import Guard, Refused

__all__ = ["add_tenants", "bars"]

#: Most keys the page shows, busiest first.
SHOWN = 50
#: The fields the pause and resume forms may carry.
PAUSE_FIELDS = ("key", "for", "csrf")


def bars(rows: list[KeyRow], width: int = 300, bar: int = 16) -> list[dict[str, Any]]:
    """The chart's bars: one per key with admissions in the last minute, most first, each
    ``{"key", "y", "width", "n", "share"}`` in the SVG's units (the widest is *width*)."""
    shown = sorted((r for r in rows if r.admitted_recent), key=lambda r: -r.admitted_recent)
    most = max((r.admitted_recent for r in shown), default=0)
    return [{"key": r.key, "y": i * (bar + 4), "width": round(width * r.admitted_recent / most, 1),
             "n": r.admitted_recent, "share": r.share} for i, r in enumerate(shown)]


def add_tenants(app: Flask, fc: Any, guard: Guard) -> None:
    """Add the page, its JSON and the pause and resume actions to the dashboard *app* of *fc*'s
    installation; *guard* decides who may pause."""

    @app.get("/queues/<name>/keys")
    def tenants_page(name: str) -> str:
        row = queue_row(fc, name)
        rows = key_rows(fc, name, SHOWN)
        return render_template("tenants.html", page="tenants", row=row, keys=rows,
                               bars=bars(rows))

    @app.get("/api/queues/<name>/keys")
    def api_tenants(name: str) -> Response:
        return jsonify(queue=queue_row(fc, name).to_dict(),
                       keys=[r.to_dict() for r in key_rows(fc, name, SHOWN)])

    @app.post("/queues/<name>/pause")
    def pause_queue(name: str) -> Any:
        guard.check_change(session, request.form, request.headers)
        key, span = _form(request.form)
        until = pause(fc, name, key, span)
        whom = f"key {key} of {name}" if key is not None else name
        return _done(name, f"paused {whom} " + (f"until {when(until)}" if until else "until resumed"))

    @app.post("/queues/<name>/resume")
    def resume_queue(name: str) -> Any:
        guard.check_change(session, request.form, request.headers)
        key, _ = _form(request.form)
        resume(fc, name, key)
        return _done(name, f"resumed {f'key {key} of {name}' if key is not None else name}")

    def _done(name: str, message: str) -> Any:
        if request.accept_mimetypes.best == "application/json":
            return jsonify(ok=True, message=message)
        flash(message)
        return redirect(url_for("tenants_page", name=name), 303)


def _form(form: Any) -> tuple[str | None, str | None]:
    """The key (none: the whole queue) and the ``for`` duration of a pause or resume form; a
    400 naming a field the form does not take."""
    for field in form:
        if field not in PAUSE_FIELDS:
            raise Refused(f"field {field!r}: the form takes 'key' and 'for'", 400)
    key = form.get("key") or None
    span = (form.get("for") or "").strip() or None
    return key, span
