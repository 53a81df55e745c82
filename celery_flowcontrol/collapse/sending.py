"""``app.send_task`` of a call that collapses: a unique call whose key is held gets the
first call's ``AsyncResult`` and nothing is sent; a debounced call joins its burst.

Celery's ``send_task`` picks the task id, publishes, then returns ``AsyncResult(task_id)``;
no signal can change what it returns, so ``before_task_publish`` alone can only turn a
duplicate into a message that runs nothing (publish.py, :func:`~.publish.mark_duplicate`).
Where flow control is installed in the producer (``FlowControl(app)``), the app's
``send_task`` is wrapped instead: a call naming a task that collapses (its decorator
defaults, when the producer knows the task, or the headers ``flow_unique``,
``flow_unique_keep``, ``flow_debounce``, ``flow_debounce_max``, ``flow_debounce_key``) is
collapsed exactly as
``apply_async`` collapses it. The wrapper is an attribute of the app instance over Celery's
public method, with the same signature (``tests/unit/test_collapse_sending.py`` fails if
Celery's changes); any other call goes to Celery's own method untouched. A producer without
flow control installed still gets the duplicate-message fallback for a unique call; a
debounced call sent from there is sent at once (it needs the wrapper to be parked).
A call of a batch task (the producer knows its ``flow_batch``, or the header ``flow_batch``
gives one: ``{"size": 64, "wait": 2, "key": "a str"}``) is parked for a batch as
``apply_async`` parks it, and gets its own ``AsyncResult``; a producer without flow control
can't batch a call (the worker would hand the body one call's arguments).
"""

from __future__ import annotations

import functools
from typing import Any

from kombu.utils.uuid import uuid

from ..protocol import UNIQUE_KEY_HEADER, read_burst
from .batching import BATCH_HEADER, batch_call, batch_spec
from .keys import debounce_spec, option_of, unique_keep, unique_key, unique_ttl
from .latest import LATEST
from .latestwins import latest_call
from .publish import DECIDED, HEADERS, call_options, claim_unique, debounce_call, decided
from .wiring import claims_of

__all__ = ["wrap_send_task"]

#: Set on the wrapper, so that installing twice wraps once.
WRAPPED = "_flowcontrol_collapse"


def wrap_send_task(app: Any) -> None:
    """Make ``app.send_task`` collapse calls as ``apply_async`` does (module docstring);
    idempotent."""
    original = app.send_task
    if getattr(original, WRAPPED, False):
        return

    @functools.wraps(original)
    def send_task(name: str, args: Any = None, kwargs: Any = None, countdown: Any = None,
                  eta: Any = None, task_id: str | None = None, *rest: Any, **options: Any) -> Any:
        def send(tid: str | None, opts: dict[str, Any] | None = None) -> Any:
            return original(name, args, kwargs, countdown, eta, tid, *rest,
                            **(options if opts is None else opts))

        if DECIDED.get():  # FlowTask.apply_async decided already (publish.py)
            return send(task_id)
        task = app.tasks.get(name)
        given = options.get("headers") or {}
        batch = given.get(BATCH_HEADER) if isinstance(given.get(BATCH_HEADER), dict) else (
            option_of(task, "flow_batch") if task is not None else None)
        if not any(h in given for h in HEADERS.values()) and not _collapses(task) and \
                batch in (None, False):
            return send(task_id)
        headers = dict(given)  # the caller's dict stays as it was
        options["headers"] = headers
        retry = options.get("retries")
        result = options.get("result_cls") or app.AsyncResult
        batched = batch_spec(name, batch) if not retry else None
        if batched is not None:
            headers.pop(BATCH_HEADER, None)

            def send_empty(tid: str, opts: dict[str, Any]) -> Any:  # the batch's own message
                return original(name, (), {}, None, None, tid, *rest, **opts)

            return batch_call(app, name, args or (), kwargs or {}, task_id, options, batched,
                              decided(send), decided(send_empty), result)
        option = call_options(task, headers, {})
        spec = debounce_spec(name, option("flow_debounce"), option("flow_debounce_max"))
        if spec is not None and not retry and read_burst(headers) is None:
            return debounce_call(app, name, args or (), kwargs or {}, options, spec,
                                 option("debounce_key"), decided(send), result)
        unique = option("flow_unique")
        if unique in ("1", 1, "true", "True"):  # as mark_duplicate reads the header
            unique = True
        if unique in (None, False, "", 0) or retry or UNIQUE_KEY_HEADER in headers:
            return decided(send)(task_id or uuid(), options)  # not unique now: the hook agrees
        ukey = unique_key(name, unique, args or (), kwargs or {})
        if ukey is None:
            return send(task_id)
        ttl = unique_ttl(name, option("flow_unique_ttl"), None)
        task_id = task_id or uuid()
        if unique_keep(name, option("flow_unique_keep"), unique) == LATEST:
            latest_call(app, name, ukey, task_id, ttl, options, send)
            return result(task_id)
        holder = claim_unique(app, ukey, task_id, ttl)
        if holder != task_id:
            return result(holder)
        headers[UNIQUE_KEY_HEADER] = ukey
        try:
            return send(task_id)
        except BaseException:
            claims_of(app).release("unique", ukey, task_id)  # never sent: nobody holds it
            raise

    setattr(send_task, WRAPPED, True)
    app.send_task = send_task


def _collapses(task: Any) -> bool:
    """True if *task* (``None``: not known here) is unique or debounced by default."""
    return task is not None and any(option_of(task, name) not in (None, False)
                                    for name in ("flow_unique", "flow_debounce"))
