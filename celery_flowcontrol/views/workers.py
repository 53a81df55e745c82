"""What every worker says of itself: the ``flowcontrol_stats`` control command, merged by node."""

from __future__ import annotations

from typing import Any

__all__ = ["worker_stats"]


def worker_stats(app: Any, timeout: float = 1.0) -> dict[str, dict[str, Any]]:
    """``flowcontrol_stats`` of every worker that answers within *timeout*: node -> figures."""
    replies = app.control.broadcast("flowcontrol_stats", reply=True, timeout=timeout) or []
    merged: dict[str, dict[str, Any]] = {}
    for reply in replies:
        for node, figures in (reply or {}).items():
            merged[str(node)] = figures if isinstance(figures, dict) else {"reply": figures}
    return dict(sorted(merged.items()))
