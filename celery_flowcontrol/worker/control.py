"""The ``flowcontrol_stats`` remote control command and its registry of figure providers.

``celery -A proj inspect flowcontrol_stats`` asks every worker for its flow-control figures. The
answer is a dict with one entry per registered provider, so other parts of the worker add their
own figures without touching this module::

    from celery_flowcontrol.worker.control import register_stats_provider

    register_stats_provider("admission", lambda state: {"held": ..., "parked": ..., "woken": ...})

A provider is called with Celery's control-panel ``state`` (``state.consumer`` is the worker's
consumer) and returns something JSON can encode; a provider that raises is reported as
``{"error": "..."}`` instead of failing the whole reply. The ``autoscaler`` provider is built in.

The command is registered when this module is imported. The worker imports it through
``celery_flowcontrol.autoscale``; the ``celery inspect`` command line checks names against the
commands known in its own process, so import this module in the app module too (or let
``FlowControl(app)`` do it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from celery.worker.control import inspect_command

__all__ = ["flowcontrol_stats", "flowcontrol_where", "register_locator", "register_stats_provider",
           "stats_providers", "unregister_stats_provider"]

StatsProvider = Callable[[Any], Any]
_providers: dict[str, StatsProvider] = {}
_lock = threading.Lock()


def register_stats_provider(name: str, fn: StatsProvider) -> None:
    """Add (or replace) the provider whose result appears under ``name`` in every reply."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"provider name must be a non-empty string, got {name!r}")
    if not callable(fn):
        raise TypeError(f"provider {name!r} must be callable, got {fn!r}")
    with _lock:
        _providers[name] = fn


def unregister_stats_provider(name: str) -> None:
    """Remove the provider registered under ``name``, if any."""
    with _lock:
        _providers.pop(name, None)


def stats_providers() -> dict[str, StatsProvider]:
    """A copy of the registry: name -> provider."""
    with _lock:
        return dict(_providers)


def collect(state: Any) -> dict[str, Any]:
    """Call every provider with ``state``; a failing one yields ``{"error": ...}``."""
    reply: dict[str, Any] = {}
    for name, fn in stats_providers().items():
        try:
            reply[name] = fn(state)
        except Exception as exc:  # one broken provider must not hide the others' figures
            reply[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return reply


@inspect_command()
def flowcontrol_stats(state: Any, **kwargs: Any) -> dict[str, Any]:
    """Flow-control figures of this worker: the autoscaler's and every registered provider's."""
    return collect(state)


def _autoscaler_figures(state: Any) -> dict[str, Any] | None:
    controller = getattr(getattr(state, "consumer", None), "controller", None)
    scaler = getattr(controller, "autoscaler", None)
    figures = getattr(scaler, "figures", None)
    return figures() if callable(figures) else None


register_stats_provider("autoscaler", _autoscaler_figures)

#: Where this worker has a task: (state, task_id) -> a dict or None (the runtime sets it).
Locator = Callable[[Any, str], Any]
_locators: list[Locator] = []


def register_locator(fn: Locator) -> None:
    """Let ``flowcontrol_where`` ask *fn* (``celery_flowcontrol.worker.runtime`` does)."""
    with _lock:
        if fn not in _locators:
            _locators.append(fn)


@inspect_command(args=[("task_id", str)], signature="<task_id>")
def flowcontrol_where(state: Any, task_id: str = "", **kwargs: Any) -> dict[str, Any] | None:
    """Whether this worker has task *task_id* lingering or admitted (``explain`` asks every
    worker, bounded by a timeout); ``None`` if it has not."""
    with _lock:
        locators = list(_locators)
    for fn in locators:
        found = fn(state, str(task_id))
        if found is not None:
            return dict(found)
    return None
