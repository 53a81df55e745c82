"""The public surface agrees with itself: how ``app`` is passed, the slot helpers' options, and
their old spellings, which still work with a DeprecationWarning.

The rule (docs/architecture.md, "The public surface"): a function an operator or a producer
calls takes ``app`` first, positionally (``backoff(app, queue, seconds)``,
``register_queue(app, config)``); a function a running task calls takes ``app=`` keyword-only,
defaulting to the current app (``settle_cost(actual)``, ``release_slot(slot_id)``,
``acquire_slot(name)``, ``with_limit(name)``).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

import celery_flowcontrol
from celery_flowcontrol import (
    FlowTask,
    SlotTimeoutError,
    acquire_slot,
    with_limit,
)

#: Run inside a task, where ``current_app`` is the task's app.
IN_A_TASK = {"settle_cost", "release_slot", "acquire_slot", "with_limit"}
#: Take no app at all: what they need comes with their arguments (a signature's app) or none.
NO_APP = {"flow_group"}
#: Take the app first, but may go without it: the app's settings, else the defaults.
APP_OPTIONAL = {"beat_schedule"}


def public_functions() -> dict[str, Callable[..., Any]]:
    return {name: getattr(celery_flowcontrol, name) for name in celery_flowcontrol.__all__
            if inspect.isfunction(getattr(celery_flowcontrol, name))}


def test_every_public_function_takes_app_by_the_rule() -> None:
    functions = public_functions()
    assert IN_A_TASK | NO_APP | APP_OPTIONAL <= set(functions), "the lists above name public functions"
    for name, fn in functions.items():
        params = list(inspect.signature(fn).parameters.values())
        app = next((p for p in params if p.name == "app"), None)
        if name in NO_APP:
            assert app is None, name
        elif name in IN_A_TASK:
            assert app is not None and app.kind is inspect.Parameter.KEYWORD_ONLY, name
            assert app.default is None, f"{name}: app= defaults to the current app"
        else:
            assert params and params[0] is app, f"{name}: app comes first"
            assert app.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
            if name in APP_OPTIONAL:
                assert app.default is None, f"{name}: app may be left out"
            else:
                assert app.default is inspect.Parameter.empty, f"{name}: app is required"


def test_the_slot_helpers_take_the_queue_then_the_same_keyword_options() -> None:
    shapes = []
    for fn in (acquire_slot, with_limit):
        params = inspect.signature(fn).parameters
        first, *rest = params.values()
        assert first.name == "name" and first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in rest), fn.__name__
        shapes.append({p.name: p.default for p in rest})
    assert shapes[0] == shapes[1] == {"timeout": "30m", "label": "", "app": None}


def in_a_task(body: Callable[[Celery], Any]) -> Any:
    """Run *body* as the body of a FlowTask whose queue "q" timed out already: the worker
    told the task so (``flow_acquire_expired``), so ``acquire_slot("q", timeout=...)``
    raises :class:`SlotTimeoutError` carrying the timeout it was given, parsed."""
    app = Celery("surface", broker="memory://", set_as_current=False)

    @app.task(base=FlowTask, bind=True, shared=False)
    def work(self: Any) -> Any:
        self.request.called_directly = False
        self.request.flow_acquire_expired = ["q"]
        return body(app)

    return work()


def timeout_of(body: Callable[[Celery], Any]) -> float | None:
    with pytest.raises(SlotTimeoutError) as caught:
        in_a_task(body)
    return caught.value.timeout


def test_keyword_options_warn_nothing() -> None:
    def enter(app: Celery) -> None:
        with with_limit("q", label="report 7", timeout="5m", app=app):
            pass

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert timeout_of(lambda app: acquire_slot("q", timeout="5m", label="x", app=app)) == 300
        assert timeout_of(enter) == 300


def test_acquire_slot_positional_options_keep_their_old_meaning_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"acquire_slot\(name, timeout, label\)"):
        assert timeout_of(lambda app: acquire_slot("q", "5m", "report 7", app=app)) == 300
    with pytest.warns(DeprecationWarning, match=r"pass timeout= by keyword"):
        assert timeout_of(lambda app: acquire_slot("q", 90, app=app)) == 90


def test_with_limit_positional_options_keep_their_old_meaning_with_a_warning() -> None:
    def enter(*options: Any) -> Callable[[Celery], None]:
        def body(app: Celery) -> None:
            with with_limit("q", *options, app=app):
                pass
        return body

    # with_limit took (name, label, timeout): "5m" here is the timeout, "report 7" the label.
    with pytest.warns(DeprecationWarning, match=r"with_limit\(name, label, timeout\)"):
        assert timeout_of(enter("report 7", "5m")) == 300
    with pytest.warns(DeprecationWarning, match=r"pass label= by keyword"):
        assert timeout_of(enter("report 7")) == 1800


def test_a_positional_option_also_given_by_keyword_is_refused() -> None:
    with pytest.raises(TypeError, match="multiple values for 'timeout'"):
        acquire_slot("q", "5m", timeout="1m")
    with pytest.raises(TypeError, match="takes the queue name positionally"):
        acquire_slot("q", "5m", "label", "extra")
