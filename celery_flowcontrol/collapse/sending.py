"""``app.send_task`` of a unique call: the first call's ``AsyncResult``, and nothing sent.

Celery's ``send_task`` picks the task id, publishes, then returns ``AsyncResult(task_id)``;
no signal can change what it returns, so ``before_task_publish`` alone can only turn a
duplicate into a message that runs nothing (publish.py, :func:`~.publish.mark_duplicate`).
Where flow control is installed in the producer (``FlowControl(app)``), the app's
``send_task`` is wrapped instead: a call naming a unique task (its ``flow_unique`` default, or
the ``flow_unique`` header) claims its key first, exactly as ``apply_async`` does, and a key
held by another call returns that call's ``AsyncResult`` without publishing. The wrapper is
an attribute of the app instance over Celery's public method, with the same signature
(``tests/unit/test_collapse_sending.py`` fails if Celery's changes); any other call goes to
Celery's own method untouched. A producer without flow control installed still gets the
duplicate-message fallback.
"""

from __future__ import annotations

import functools
from typing import Any

from kombu.utils.uuid import uuid

from ..protocol import UNIQUE_HEADER, UNIQUE_KEY_HEADER
from .keys import option_of, unique_key, unique_ttl
from .publish import DECIDED, claim_unique
from .wiring import claims_of

__all__ = ["wrap_send_task"]

#: Set on the wrapper, so that installing twice wraps once.
WRAPPED = "_flowcontrol_collapse"


def wrap_send_task(app: Any) -> None:
    """Make ``app.send_task`` collapse unique calls (module docstring); idempotent."""
    original = app.send_task
    if getattr(original, WRAPPED, False):
        return

    @functools.wraps(original)
    def send_task(name: str, args: Any = None, kwargs: Any = None, countdown: Any = None,
                  eta: Any = None, task_id: str | None = None, *rest: Any, **options: Any) -> Any:
        def send(tid: str | None) -> Any:
            return original(name, args, kwargs, countdown, eta, tid, *rest, **options)

        if DECIDED.get():  # FlowTask.apply_async decided already (publish.py)
            return send(task_id)
        headers = options.get("headers") or {}
        task = app.tasks.get(name)
        spec = headers.get(UNIQUE_HEADER)
        if spec is None and task is not None:
            spec = option_of(task, "flow_unique")
        if spec in ("1", 1, "true", "True"):  # as mark_duplicate reads the header
            spec = True
        if spec in (None, False, "", 0) or options.get("retries") or UNIQUE_KEY_HEADER in headers:
            return send(task_id)
        ukey = unique_key(name, spec, args or (), kwargs or {})
        if ukey is None:
            return send(task_id)
        ttl = unique_ttl(name, option_of(task, "flow_unique_ttl") if task is not None else None, None)
        task_id = task_id or uuid()
        holder = claim_unique(app, ukey, task_id, ttl)
        if holder != task_id:
            return (options.get("result_cls") or app.AsyncResult)(holder)
        options["headers"] = {**{k: v for k, v in headers.items() if k != UNIQUE_HEADER},
                              UNIQUE_KEY_HEADER: ukey}
        try:
            return send(task_id)
        except BaseException:
            claims_of(app).release("unique", ukey, task_id)  # never sent: nobody holds it
            raise

    setattr(send_task, WRAPPED, True)
    app.send_task = send_task
