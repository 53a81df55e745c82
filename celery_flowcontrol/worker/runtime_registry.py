"""Which worker runtime runs in this process, per app: :func:`runtime_of`.

The parts Celery builds for us (the strategy, the request, the remote-control command) look the
running :class:`~celery_flowcontrol.worker.runtime.WorkerRuntime` up here, once per message; the
runtime registers itself when the consumer step starts it. A pool child forgets its parent's
runtime on fork (its threads do not run there), so only a worker's main process finds one.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["forget", "remember", "runtime_of"]

_RUNNING: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_last: list[Any] = [None, None]  # the last (app, runtime) looked up: a worker has one


def runtime_of(app: Any) -> Any:
    """The running runtime of *app* in this process, or ``None``."""
    if _last[0] is app:
        return _last[1]
    getter = getattr(app, "_get_current_object", None)  # celery.current_app is a proxy
    runtime = _RUNNING.get(getter() if callable(getter) else app)
    if runtime is not None:
        _last[0], _last[1] = app, runtime
    return runtime


def remember(app: Any, runtime: Any) -> None:
    """*runtime* now runs for *app* in this process."""
    with _LOCK:
        _RUNNING[app] = runtime
        _last[0] = None


def forget(app: Any) -> Any:
    """*app*'s runtime stopped; the one that ran, or ``None``."""
    with _LOCK:
        _last[0] = _last[1] = None
        return _RUNNING.pop(app, None)


def _forget_all() -> None:
    _RUNNING.clear()
    _last[0] = _last[1] = None


os.register_at_fork(after_in_child=_forget_all)
