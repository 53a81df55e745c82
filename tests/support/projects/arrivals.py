"""The e2e project that records when a task reached a worker: :mod:`tests.support.projects.base`,
with ``proj.work`` handing each message sent with the header :data:`HEADER` to the gauge
(:meth:`~tests.support.gauge.Gauge.arrive`, keyed by the header's label) before its strategy
asks admission.

Celery's ``task_received`` signal would come too late for this: Celery's own strategy sends it,
and the flow strategy calls that only once the task is admitted. The wrapper here is what
Celery's consumer calls for every delivery, in the worker's main process, before the gate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery

from tests.support.gauge import Gauge
from tests.support.harness import Harness
from tests.support.projects.base import create_app as create_base_app

#: The message header that names the label whose arrival the gauge records.
HEADER = "fct_arrival"


def create_app(env: Mapping[str, str]) -> Celery:
    """The base e2e app, its ``proj.work`` recording arrivals."""
    app = create_base_app(env)
    gauge = Gauge(env.get("FCT_GAUGE_URL", "redis://127.0.0.1:6379/0"), env["FCT_PREFIX"])
    work = app.tasks["proj.work"]
    start_strategy = work.start_strategy

    def recording(consumer_app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
        handler = start_strategy(consumer_app, consumer, **kwargs)

        def arrived(message: Any, *args: Any, **kw: Any) -> Any:
            label = (message.headers or {}).get(HEADER)
            if label is not None:
                gauge.arrive(str(label))
            return handler(message, *args, **kw)

        return arrived

    work.start_strategy = recording
    return app


class ArrivalsHarness(Harness):
    """A harness running :mod:`tests.support.projects.arrivals`."""

    project = "tests.support.projects.arrivals"
