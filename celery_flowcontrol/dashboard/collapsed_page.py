"""The dashboard's page of calls that collapse: held unique keys, latest-wins keys, pending
debounces and batches gathering (``/collapsed``, and ``/api/collapsed`` for scripts).
Read-only: a key frees by itself."""

from __future__ import annotations

from typing import Any

from flask import Flask, Response, jsonify, render_template

from ..views.collapsed import collapsed, gathering, latest_keys

__all__ = ["add_collapsed"]


def add_collapsed(app: Flask, fc: Any) -> None:
    """Add the page and its JSON to the dashboard *app* of *fc*'s installation."""

    @app.get("/collapsed")
    def collapsed_page() -> str:
        unique, pending = collapsed(fc, 200)
        return render_template("collapsed.html", page="collapsed", unique=unique, pending=pending,
                               latest=latest_keys(fc, 200), batches=gathering(fc, 200))

    @app.get("/api/collapsed")
    def api_collapsed() -> Response:
        unique, pending = collapsed(fc, 200)
        return jsonify(unique=[u.to_dict() for u in unique], debounce=[d.to_dict() for d in pending],
                       latest=[k.to_dict() for k in latest_keys(fc, 200)],
                       batch=[b.to_dict() for b in gathering(fc, 200)])
