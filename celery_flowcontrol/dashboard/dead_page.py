"""The dashboard's dead-letter page: the newest dead letters with their reason, and a Requeue
button that parks one anew, due now, as ``celery flowcontrol dead requeue ID`` does (``/dead``,
``/api/dead``, ``POST /dead/requeue``). A requeue is a change: it needs the dashboard token
(an unlocked session with its CSRF token, or a bearer header), like every other change."""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, flash, jsonify, redirect, render_template, request, session, url_for

from ..views.dead import dead_rows, requeue
from .security import Guard, Refused

__all__ = ["add_dead"]

#: Most dead letters the page shows, newest first.
SHOWN = 200
#: The fields the requeue form may carry.
REQUEUE_FIELDS = ("id", "csrf")


def add_dead(app: Flask, fc: Any, guard: Guard) -> None:
    """Add the page, its JSON and the requeue action to the dashboard *app* of *fc*'s
    installation; *guard* decides who may requeue."""

    @app.get("/dead")
    def dead_page() -> str:
        return render_template("dead.html", page="dead", rows=dead_rows(fc, SHOWN))

    @app.get("/api/dead")
    def api_dead() -> Response:
        return jsonify(dead=[r.to_dict() for r in dead_rows(fc, SHOWN)])

    @app.post("/dead/requeue")
    def requeue_dead() -> Any:
        guard.check_change(session, request.form, request.headers)
        done = requeue(fc, letter_ids(request.form))
        if request.accept_mimetypes.best == "application/json":
            return jsonify(ok=all(r.refused is None for r in done), requeued=[r.to_dict() for r in done])
        for r in done:
            flash(r.text())
        return redirect(url_for("dead_page"), 303)


def letter_ids(form: Any) -> list[int]:
    """The dead-letter ids of a requeue form (``id``, once or more): a 400 naming what is wrong
    for a field the form does not take, a value that is no id, or no id at all."""
    for key in form:
        if key not in REQUEUE_FIELDS:
            raise Refused(f"field {key!r}: the requeue form takes 'id' (one or more)", 400)
    values = [v.strip() for v in form.getlist("id")]
    if not values:
        raise Refused("field 'id' is required: the dead letter to requeue", 400)
    bad = [v for v in values if not v.isdigit() or int(v) < 1]
    if bad:
        raise Refused(f"field 'id': {bad[0]!r} is not a dead-letter id (a number from the page)", 400)
    return [int(v) for v in values]
