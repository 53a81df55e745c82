"""Call a method of an app's admission backend from any process: :func:`call_backend`.

A shared backend (Redis) is called directly, and so is an in-process one (``memory://``) in
the worker's main process that holds it; anywhere else the call goes through the workers'
remote control (remote.py's ``flowcontrol_call``). The facade's ``FlowControl.call_backend``
and a batch's run in a pool process (collapse/batchrun.py) both call it.
"""

from __future__ import annotations

import os
from typing import Any

from ..engines import engines_of
from ..errors import FlowControlError
from .runtime_registry import runtime_of

__all__ = ["call_backend", "in_worker_main"]


def in_worker_main(app: Any) -> bool:
    """True in the main process of a worker of *app* whose flow control is running."""
    runtime = runtime_of(app)
    return runtime is not None and runtime.pid == os.getpid()


def call_backend(app: Any, method: str, **kwargs: Any) -> Any:
    """Call *method* of *app*'s admission backend with *kwargs* (the module docstring says
    where it runs); what it returns. A refusal that came back through remote control is a
    :class:`FlowControlError` with the worker's message."""
    engines = engines_of(app)
    if not engines.backend_is_local or in_worker_main(app):
        return getattr(engines.backend, method)(**kwargs)
    # In a pool process the worker that runs us holds the backend: ask it alone and stop
    # at its answer. Elsewhere ask every worker (an in-process backend means one, usually).
    task = app.current_task  # the task running on this thread, or None
    hostname = getattr(getattr(task, "request", None), "hostname", None)
    call = {"method": method, "arguments": kwargs}
    if hostname:
        replies = app.control.broadcast("flowcontrol_call", arguments=call, reply=True,
                                        timeout=5.0, destination=[hostname], limit=1)
    else:
        # A release needs the one worker that holds the slot: take the first answer, and
        # ask them all only when that one did not hold it. Overrides go to every worker.
        replies = app.control.broadcast("flowcontrol_call", arguments=call, reply=True,
                                        timeout=5.0, limit=1) if method == "release" else []
        if not any(a.get("ok") for r in replies or [] for a in r.values()
                   if isinstance(a, dict)):
            replies = app.control.broadcast("flowcontrol_call", arguments=call,
                                            reply=True, timeout=5.0)
    replies = replies or []
    answers = [a for reply in replies for a in reply.values() if isinstance(a, dict)]
    oks = [a["ok"] for a in answers if "ok" in a]
    if oks:
        return any(oks) if method == "release" else oks[0]
    errors = [str(a.get("error")) for a in answers]
    raise FlowControlError(
        errors[0] if errors else "no worker answered: the in-process (memory://) backend "
        "lives in a running worker's main process; start one, or use a redis:// backend")
