"""settle_cost inside a running FlowTask corrects its admission's charge.

A real in-thread Celery worker (memory:// broker, the flow-control bootstep) runs the tasks;
admission is the Redis backend on the real server, so what the task settled is read back
from Redis. Until the worker passes a message's flow_cost to admission, a task is charged
its default cost, 1; the settle corrects that charge.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from celery_flowcontrol import FlowControl, FlowTask, QueueConfig, backoff, settle_cost
from celery_flowcontrol.admission.base import BACKOFF
from celery_flowcontrol.errors import FlowControlConfigError, SettleError, UnknownQueueError

# The cost window is a day long: a fixed window that rolled over between two reads of its use
# would read 0 (a CI run met the minute boundary mid-test). A day's boundary is midnight UTC.
TOKENS = QueueConfig("tok", rate_limit=["50/d", {"limit": 1000, "period": 86400, "per": "cost"}])


@pytest.fixture
def app(redis_url: str, key_prefix: str, sqlite_url: str) -> Iterator[Celery]:
    app = Celery(key_prefix, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(flowcontrol_backend_url=redis_url, flowcontrol_key_prefix=key_prefix,
                    flowcontrol_parking_url=sqlite_url, flowcontrol_queues=[TOKENS],
                    task_acks_late=True, worker_prefetch_multiplier=1,
                    task_reject_on_worker_lost=True,
                    worker_hijack_root_logger=False)
    FlowControl(app)

    @app.task(base=FlowTask, bind=True, flow_queue="tok", name=f"{key_prefix}.spend")
    def spend(self: Any, actual: Any, again: Any = None) -> Any:
        out: dict[str, Any] = {"delta": settle_cost(actual)}
        if again is not None:
            try:
                settle_cost(again)
            except SettleError as exc:
                out["again"] = str(exc)
        return out

    @app.task(base=FlowTask, bind=True, flow_queue="tok", name=f"{key_prefix}.refused")
    def refused(self: Any, values: list[Any]) -> list[str]:
        out = []
        for actual in values:
            try:
                settle_cost(actual)
            except SettleError as exc:
                out.append(f"SettleError: {exc}")
            else:
                out.append("settled")
        return out

    @app.task(bind=True, name=f"{key_prefix}.plain")
    def plain(self: Any) -> str:
        try:
            settle_cost(5)
        except SettleError as exc:
            return str(exc)
        return "settled"

    app.conf.task_serializer = app.conf.result_serializer = "pickle"  # NaN and inf travel
    app.conf.accept_content = ["pickle", "json"]
    root = logging.getLogger()
    level = root.level  # the in-thread worker sets the root logger's level: later tests' caplog
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            yield app
    finally:
        root.setLevel(level)


def task(app: Celery, name: str) -> Any:
    return app.tasks[f"{app.main}.{name}"]


def _cost_used(app: Celery) -> float:
    return FlowControl(app).backend.stats("tok").rates[1].used


def test_a_task_settles_its_true_cost_once(app: Celery) -> None:
    result = task(app, "spend").delay(400, again=10).get(timeout=20)
    assert result["delta"] == 399, "charged 1 at admission, 400 settled"
    assert "settled already" in result["again"]
    assert _cost_used(app) == 400
    assert task(app, "spend").delay(0).get(timeout=20)["delta"] == -1
    assert _cost_used(app) == 400
    assert FlowControl(app).backend.stats("tok").rates[0].used == 2, "per call: one each"


def test_a_bad_actual_is_refused_and_changes_nothing(app: Celery) -> None:
    answers = task(app, "refused").delay([-1, math.nan, math.inf, "12", None]).get(timeout=20)
    assert all(a.startswith("SettleError: ") and "finite number >= 0" in a for a in answers)
    assert _cost_used(app) == 1, "only the admission's charge"


def test_outside_a_flow_task_settle_cost_is_refused(app: Celery) -> None:
    with pytest.raises(SettleError, match="inside a FlowTask"):
        settle_cost(5, app=app)
    assert "inside a FlowTask" in task(app, "plain").delay().get(timeout=20)


def test_backoff_from_any_process_pauses_the_queue(app: Celery) -> None:
    end = backoff(app, "tok", 30)
    stats = FlowControl(app).backend.stats("tok")
    assert stats.backoff_until == end
    from celery_flowcontrol.admission import Ticket

    d = FlowControl(app).backend.try_admit(Ticket("tok", "probe", "probe-instance"))
    assert not d.admitted and d.reason == BACKOFF
    with pytest.raises(FlowControlConfigError):
        backoff(app, "tok", 0)
    with pytest.raises(UnknownQueueError):
        backoff(app, "nope", 5)
