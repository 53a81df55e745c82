"""The web dashboard: ``celery -A proj flowcontrol dashboard`` (127.0.0.1:5566 by default).

Pages: queues (figures, overrides, live charts of the last 15 minutes), one queue (busy slots,
waiters in order, parked messages; release a slot, edit capacity and max hold), workers (the
autoscaler's figures per worker). ``/metrics`` serves Prometheus. Changes need the token.

The stack is Flask (Jinja2 templates, autoescaped) served by waitress when it is installed, else
by Werkzeug's threaded server; both come with the ``dashboard`` extra. No build step: the
JavaScript is one small static file.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import MissingDependencyError

__all__ = ["create_app", "need_dependencies", "serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5566


def need_dependencies() -> None:
    """Raise :class:`~celery_flowcontrol.errors.MissingDependencyError` naming the
    ``dashboard`` extra unless its stack (Flask, prometheus_client) imports."""
    for module in ("flask", "prometheus_client"):
        try:
            __import__(module)
        except ImportError as exc:
            raise MissingDependencyError("dashboard", module) from exc


def create_app(fc: Any, token: str | None = None, **options: Any) -> Any:
    """The dashboard's WSGI app (a Flask app) for FlowControl *fc*.

    *token* unlocks changes (``None``: ``flowcontrol_dashboard_token``; no token, or ``""``: read-only).
    *options*: ``sample_every`` (2.0 s), ``window`` (900 s of history), ``sampler`` (True:
    start the background sampler), ``worker_timeout`` (1.0 s for ``flowcontrol_stats``).
    """
    need_dependencies()
    from .app import build_app

    return build_app(fc, token=token if token is not None else fc.settings.dashboard_token, **options)


def serve(fc: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, token: str | None = None) -> None:
    """Serve the dashboard until interrupted (waitress if installed, else Werkzeug)."""
    app = create_app(fc, token)
    try:
        waitress = importlib.import_module("waitress")
    except ImportError:
        from werkzeug.serving import run_simple

        run_simple(host, port, app, threaded=True, use_reloader=False, use_debugger=False)
        return
    waitress.serve(app, host=host, port=port, threads=8, ident="flowcontrol")
