"""collapse/sending.py wraps ``Celery.send_task`` by its public signature: this fails when
Celery changes the parts of it the wrapper passes on by position or reads by name."""

from __future__ import annotations

import inspect

import celery
from celery import Celery

from celery_flowcontrol.collapse.sending import WRAPPED, wrap_send_task


def test_celery_send_task_keeps_the_signature_the_wrapper_relies_on() -> None:
    params = inspect.signature(Celery.send_task).parameters
    assert list(params)[:7] == ["self", "name", "args", "kwargs", "countdown", "eta", "task_id"], (
        f"celery {celery.__version__} changed send_task's positional parameters: {list(params)[:8]}")
    assert {"result_cls", "retries"} <= set(params)
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())  # headers=


def test_wrapping_twice_wraps_once_and_keeps_the_name() -> None:
    app = Celery("t", set_as_current=False)
    wrap_send_task(app)
    wrapped = app.send_task
    wrap_send_task(app)
    assert app.send_task is wrapped and getattr(wrapped, WRAPPED)
    assert wrapped.__name__ == "send_task" and wrapped.__wrapped__ == app.__class__.send_task.__get__(app)
