"""The e2e project of the release-path test: :mod:`tests.support.projects.base` plus ``proj.fate``,
a task that ends the way it is told to (every way a Celery request can finish)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from celery import Celery, Task
from celery.exceptions import Ignore, Reject

from celery_flowcontrol import FlowTask
from tests.support.gauge import Gauge
from tests.support.harness import Harness
from tests.support.projects.base import create_app as create_base_app

#: The flow queue of ``proj.fate``; the test registers it (``flowcontrol_queues``).
QUEUE = "fates"


def create_app(env: Mapping[str, str]) -> Celery:
    """The base e2e app with ``proj.fate(label, fate)``."""
    app = create_base_app(env)
    gauge = Gauge(env.get("FCT_GAUGE_URL", "redis://127.0.0.1:6379/0"), env["FCT_PREFIX"])

    # Gated by the test's cap-1 queue: without a flow queue a FlowTask is never admitted, and
    # a follow-up that overlaps a run would only show the pool's own concurrency.
    @app.task(name="proj.fate", shared=False, base=FlowTask, bind=True, max_retries=3,
              flow_queue=QUEUE)
    def fate(self: Task, label: str, how: str) -> str:
        exec_id = gauge.enter(label)
        try:
            if how == "fail":
                raise ValueError("as told")
            if how == "retry" and not self.request.retries:
                raise self.retry(countdown=0)
            if how == "retry-held" and not self.request.retries:
                # The retry is published, then the run goes on until the test opens the gate:
                # a published retry is not the end of the run that holds the slot.
                retry = self.retry(countdown=0, throw=False)
                while not gauge.gate_open():
                    time.sleep(0.05)
                raise retry
            if how == "reject":
                raise Reject("as told", requeue=False)
            if how == "ignore":
                raise Ignore()
            if how == "sleep":
                time.sleep(30)
            if how == "exit" and gauge.client.set(gauge.key(f"exited:{label}"), 1, nx=True):
                os._exit(1)  # the pool child dies mid-task: WorkerLostError in the parent
            return label
        finally:
            gauge.exit(exec_id, label)

    return app


class FatesHarness(Harness):
    """A :class:`Harness` running this module's project."""

    project = "tests.support.projects.fates"


def stats(h: FatesHarness, queue: str) -> Any:
    """The queue's stats as every worker sees them (the Redis backend)."""
    from celery_flowcontrol import FlowControl

    return FlowControl(h.app).backend.stats(queue)
