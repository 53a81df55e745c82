"""The dashboard's Flask app: server-rendered pages, JSON for the live parts, ``/metrics``.

Pages render everything on the server (they work without JavaScript); ``static/dashboard.js``
polls the JSON endpoints every 2 s to refresh figures, tables and charts in place, writing
only ``textContent`` (never HTML). Jinja autoescapes every template value, and the
Content-Security-Policy allows scripts from this origin only, so a label, key or task name can
never run as code.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from flask import Flask, Response, abort, flash, jsonify, redirect, render_template, request, session, url_for

from ..config import unknown_key_detail
from ..errors import FlowControlError, UnknownQueueError
from ..metrics import FlowControlCollector, Sampler
from ..views import changes
from ..views.parked import ParkedRow, parked_rows
from ..views.queues import queue_row, queue_rows
from ..views.slot_rows import queue_of_slot, slot_rows
from ..views.text import capacity_text, duration, max_hold_text, when
from ..views.waiters import waiter_rows
from ..views.workers import worker_stats
from .collapsed_page import add_collapsed
from .dead_page import add_dead
from .history import History, SamplerThread
from .security import Guard, Refused
from .tenants_page import add_tenants
from .why_page import add_why

__all__ = ["build_app"]

#: Seconds one round of worker replies is reused.
WORKERS_TTL = 3.0

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


def build_app(fc: Any, *, token: str | None = None, sample_every: float = 2.0, window: float = 900.0,
              sampler: bool = True, worker_timeout: float = 1.0) -> Flask:
    """The dashboard of *fc*'s installation (see :func:`celery_flowcontrol.dashboard.create_app`)."""
    app = Flask(__name__)
    app.secret_key = os.urandom(32)  # sessions live as long as this process
    app.config.update(SESSION_COOKIE_NAME="flowcontrol_session", SESSION_COOKIE_HTTPONLY=True,
                      SESSION_COOKIE_SAMESITE="Strict")
    guard = Guard(token)
    reclaim_every = None if type(fc.backend).__name__ == "MemoryBackend" else fc.settings.reclaim_interval
    metrics_sampler = Sampler(fc, reclaim_every=reclaim_every)
    history = History(sample_every, window)
    thread = SamplerThread(metrics_sampler, history)
    app.extensions["flowcontrol"] = {"fc": fc, "guard": guard, "history": history, "thread": thread,
                                     "sampler": metrics_sampler}
    if sampler:
        thread.start()

    cache: dict[str, Any] = {"at": -1e9, "replies": {}}
    cache_lock = threading.Lock()

    def workers() -> dict[str, dict[str, Any]]:
        # One broadcast serves every page, poll and scrape of the next few seconds: each one
        # waits worker_timeout for replies, and many open tabs must not multiply that.
        with cache_lock:
            if time.monotonic() - cache["at"] >= WORKERS_TTL:
                cache["replies"] = worker_stats(fc.app, worker_timeout)
                cache["at"] = time.monotonic()
            return dict(cache["replies"])

    collector = FlowControlCollector(fc, metrics_sampler, workers=workers)

    @app.context_processor
    def context() -> dict[str, Any]:
        return {"guard": guard, "unlocked": guard.unlocked(session), "csrf": guard.csrf_token(session),
                "capacity_text": capacity_text, "max_hold_text": max_hold_text, "duration": duration,
                "when": when, "sample_every": sample_every, "inf": float("inf")}

    @app.after_request
    def headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    # Errors answer in the format asked for: JSON for /api/ and for a client that asked for it.
    @app.errorhandler(Refused)
    def refused(exc: Refused) -> tuple[Any, int]:
        if wants_json():
            return jsonify(error=exc.message), exc.status
        return render_template("refused.html", message=exc.message), exc.status

    @app.errorhandler(FlowControlError)
    def failed(exc: FlowControlError) -> tuple[Any, int]:
        status = 404 if isinstance(exc, UnknownQueueError) else 400
        message = (str(exc).splitlines() or [type(exc).__name__])[0]
        if wants_json():
            return jsonify(error=message), status
        return render_template("refused.html", message=message), status

    # -- pages -----------------------------------------------------------------------------
    @app.get("/")
    def queues() -> str:
        return render_template("queues.html", page="queues", rows=queue_rows(fc))

    @app.get("/queues/<name>")
    def queue(name: str) -> str:
        row = queue_row(fc, name)
        return render_template("queue.html", page="queue", row=row, slots=slot_rows(fc, name),
                               waiters=waiter_rows(fc, name, 100), parked=_parked(fc, name))

    @app.get("/workers")
    def workers_page() -> str:
        try:
            replies, error = workers(), None
        except Exception as exc:  # the broker is down: say so on the page
            replies, error = {}, f"{type(exc).__name__}: {exc}"
        return render_template("workers.html", page="workers", workers=replies, error=error)

    # -- JSON --------------------------------------------------------------------------------
    @app.get("/api/queues")
    def api_queues() -> Response:
        return jsonify(queues=[r.to_dict() for r in queue_rows(fc)], series=history.series(),
                       sampling_error=thread.last_error)

    @app.get("/api/queues/<name>")
    def api_queue(name: str) -> Response:
        row = queue_row(fc, name)
        return jsonify(queue=row.to_dict(), slots=[s.to_dict() for s in slot_rows(fc, name)],
                       waiters=[w.to_dict() for w in waiter_rows(fc, name, 100)],
                       parked=[p.to_dict() for p in _parked(fc, name)], series=history.series(name)[name])

    @app.get("/api/workers")
    def api_workers() -> Response:
        return jsonify(workers=workers())

    @app.get("/metrics")
    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)

    add_collapsed(app, fc)  # held unique keys, pending debounces (dashboard/collapsed_page.py)
    add_dead(app, fc, guard)  # dead letters, and requeueing them (dashboard/dead_page.py)
    add_why(app, fc)  # a typed task id: why it waits (dashboard/why_page.py)
    add_tenants(app, fc, guard)  # a queue's keys, pause and resume (dashboard/tenants_page.py)

    # -- changes -----------------------------------------------------------------------------
    @app.post("/unlock")
    def unlock() -> Any:
        guard.unlock(session, request.form)
        flash("unlocked: changes are allowed in this browser session")
        return redirect(_back(), 303)

    @app.post("/lock")
    def lock() -> Any:
        guard.check_csrf(session, request.form)
        guard.lock(session)
        flash("locked: read-only again")
        return redirect(_back(), 303)

    @app.post("/queues/<name>/release")
    def release(name: str) -> Any:
        guard.check_change(session, request.form, request.headers)
        slot_id = request.form.get("slot_id", "")
        if queue_of_slot(slot_id) != name:
            raise Refused(f"slot {slot_id!r} is not a slot of {name!r}", 400)
        changes.release(fc, slot_id)
        return _done(name, f"released slot {slot_id}")

    @app.post("/queues/<name>/capacity")
    def capacity(name: str) -> Any:
        guard.check_change(session, request.form, request.headers)
        row = changes.set_capacity(fc, name, change_value(request.form))
        what = "reset to config" if row.capacity_override is None else "overridden"
        return _done(name, f"capacity of {name}: {capacity_text(row.capacity, None)} ({what})")

    @app.post("/queues/<name>/max-hold")
    def max_hold(name: str) -> Any:
        guard.check_change(session, request.form, request.headers)
        row = changes.set_max_hold(fc, name, change_value(request.form))
        what = "reset to config" if row.max_hold_override is None else "overridden"
        return _done(name, f"max hold of {name}: {duration(row.max_hold)} ({what})")

    @app.post("/queues/<name>/rate")
    def rate(name: str) -> Any:
        guard.check_change(session, request.form, request.headers)
        row = changes.set_rate_limit(fc, name, change_value(request.form))
        what = "overridden" if row.rate_override else "reset to config"
        return _done(name, f"rate limits of {name}: {row.rates_text()} ({what})")

    def _done(name: str, message: str) -> Any:
        if request.accept_mimetypes.best == "application/json":
            return jsonify(ok=True, message=message)
        flash(message)
        return redirect(url_for("queue", name=name), 303)

    return app


#: The fields a change form may carry besides its ``value``.
FORM_FIELDS = ("value", "csrf", "next")


def wants_json() -> bool:
    """True for an /api/ path or a client whose Accept header prefers JSON."""
    return request.path.startswith("/api/") or request.accept_mimetypes.best == "application/json"


def change_value(form: Any) -> str:
    """The one explicit value of a change form: its ``value`` field (``"reset"`` resets). A
    missing or empty value, or a field the form does not take (``capacity=5`` for
    ``value=5``), is a 400 naming it, so a misnamed field never resets an override. The
    page's Reset button sends ``value=reset`` next to the (empty) text field."""
    for key in form:
        if key not in FORM_FIELDS:
            raise Refused(f"field {key!r}: {unknown_key_detail(key, ['value'])}", 400)
    values = [v.strip() for v in form.getlist("value") if v.strip()]
    if "reset" in (v.lower() for v in values):
        return "reset"
    if len(values) != 1:
        detail = "is required" if not values else f"was sent {len(values)} times"
        raise Refused(f"field 'value' {detail}: a value, or 'reset' to go back to config", 400)
    return values[0]


def _parked(fc: Any, name: str) -> list[ParkedRow]:
    try:
        return parked_rows(fc, name, 50)
    except FlowControlError as exc:
        if isinstance(exc, UnknownQueueError):
            raise
        return []  # the parking database is down; the page says "?" for the count


def _back() -> str:
    """Where a form posted from, if it is a page of this dashboard."""
    target = request.form.get("next", "/")
    if not target.startswith("/") or target.startswith("//"):
        abort(400)
    return target
