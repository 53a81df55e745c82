"""The benchmark project of the drain's bound: :mod:`tests.support.projects.base`, with
``proj.work``'s messages acked unrun by the worker that receives them.

What a Celery worker's main process does, at the least, with each message it takes out of its
broker: kombu's fetch and its bookkeeping of the unacked message, Celery's decoding of the
message into the task's handler, and the ack. Parking a denied message does all of that and
more (the admission's answer, the row's commit), so this rate bounds any drain that goes
through Celery's consumer (benchmarks/flood.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery

from tests.support.harness import Harness
from tests.support.projects.base import create_app as create_base_app


def create_app(env: Mapping[str, str]) -> Celery:
    """The base e2e app, its ``proj.work`` acking each message it receives, unrun."""
    app = create_base_app(env)
    work = app.tasks["proj.work"]

    def acking(consumer_app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
        def handler(message: Any, *args: Any, **kw: Any) -> None:
            message.ack()

        return handler

    work.start_strategy = acking
    return app


class AckedHarness(Harness):
    """A :class:`Harness` running this module's project."""

    project = "tests.support.projects.acked"
