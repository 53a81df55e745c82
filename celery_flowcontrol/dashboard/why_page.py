"""The dashboard's answer to "why is my task waiting?": a task id typed into the search box
(``/why?task_id=...``, and ``/api/why/<task_id>`` for scripts), answered as ``explain`` does:
one sentence, then where it is, what holds it and its place in line. Read-only."""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, jsonify, render_template, request

from ..views.explain import explain_task

__all__ = ["add_why"]

#: How long the workers may take to answer, when only they can tell (a lingering task).
TIMEOUT = 1.0


def add_why(app: Flask, fc: Any) -> None:
    """Add the page and its JSON to the dashboard *app* of *fc*'s installation."""

    @app.get("/why")
    def why_page() -> str:
        task_id = (request.args.get("task_id") or "").strip()
        out = explain_task(fc, task_id, timeout=TIMEOUT) if task_id else None
        return render_template("why.html", page="why", task_id=task_id, out=out)

    @app.get("/api/why/<task_id>")
    def api_why(task_id: str) -> Response:
        return jsonify(explain_task(fc, task_id, timeout=TIMEOUT))
