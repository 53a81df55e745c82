"""The e2e project of the slot tests: :mod:`tests.support.projects.base` plus tasks that hold, acquire,
release and fan out slots, and a :class:`SlotsHarness` that runs it.

Tasks added to ``proj.work``, ``proj.gate``, ``proj.hold`` and ``proj.noop``:

``proj.place``          a manual-queue task: records ``self.request.flow_slot`` in the list
                        ``<prefix>:slots`` (as a phone call passes it to the provider) and returns it
``proj.release``        ``release_slot(slot_id)`` from another task; returns ``released``
``proj.acquire``        ``acquire_slot(queue, timeout)`` then a gauge-measured hold; counts its runs
``proj.nested``          ``acquire_slot`` of two queues, one after the other, then a measured hold
``proj.limited``         a gauge-measured block inside ``with_limit(queue)``, raising if asked
``proj.serial_step``    ``serial=True``: one at a time fleet-wide, measured by the gauge
``proj.square``         a flow_group member: ``x * x``, measured by the gauge
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from celery import Celery, Task

from celery_flowcontrol import FlowTask, acquire_slot, release_slot, with_limit
from tests.support.gauge import Gauge
from tests.support.harness import Harness
from tests.support.projects.base import create_app as create_base_app


def create_app(env: Mapping[str, str]) -> Celery:
    """The base e2e app with the slot tasks above (always flow-controlled)."""
    app = create_base_app(env)
    prefix = env["FCT_PREFIX"]
    gauge_url = env.get("FCT_GAUGE_URL", "redis://127.0.0.1:6379/0")
    gauge = Gauge(gauge_url, prefix)

    def record(key: str, value: str) -> None:
        client = gauge.client  # one connection per process (pool children fork)
        client.rpush(f"{prefix}:{key}", value)

    @app.task(name="proj.place", shared=False, base=FlowTask, bind=True)
    def place(self: Task, label: str) -> str:
        """Take the manual slot and "hand it to the provider" (the list ``<prefix>:slots``)."""
        slot = str(self.request.flow_slot)
        record("slots", f"{label}|{slot}")
        return slot

    @app.task(name="proj.release", shared=False, base=FlowTask)
    def release(slot_id: str) -> bool:
        """The webhook's task: free the slot; ``released`` says whether it was busy."""
        released = release_slot(slot_id).released
        record("released", f"{slot_id}|{int(released)}")
        return released

    @app.task(name="proj.acquire", shared=False, base=FlowTask, bind=True)
    def acquire(self: Task, label: str, queue: str, timeout: float, seconds: float = 0.0) -> str:
        """Count this run (code before ``acquire_slot`` runs again after parking), then hold."""
        record("acquire-runs", label)
        slot = acquire_slot(queue, timeout=timeout, label=label)
        exec_id = gauge.enter(label)
        try:
            time.sleep(seconds)
        finally:
            gauge.exit(exec_id, label)
        return slot

    @app.task(name="proj.nested", shared=False, base=FlowTask)
    def nested(label: str, first: str, second: str) -> list[str]:
        """Take a slot of *first*, then one of *second*."""
        slots = [acquire_slot(first, timeout=30, label=label), acquire_slot(second, timeout=30, label=label)]
        exec_id = gauge.enter(label)
        gauge.exit(exec_id, label)
        return slots

    @app.task(name="proj.limited", shared=False, base=FlowTask)
    def limited(label: str, queue: str, fail: bool = False) -> str:
        """Hold a slot of *queue* for one block; the block raises when *fail*."""
        with with_limit(queue, label=label, timeout=30) as slot:
            record("limited-slots", f"{label}|{slot}")
            exec_id = gauge.enter(label)
            try:
                if fail:
                    raise ValueError(f"{label} failed inside with_limit")
            finally:
                gauge.exit(exec_id, label)
        return slot

    @app.task(name="proj.serial_step", shared=False, base=FlowTask, serial=True)
    def serial_step(label: str, seconds: float = 0.02) -> str:
        """One step of a serial job: never two at once, fleet-wide."""
        exec_id = gauge.enter(label)
        try:
            time.sleep(seconds)
        finally:
            gauge.exit(exec_id, label)
        return label

    @app.task(name="proj.square", shared=False, base=FlowTask)
    def square(x: int, seconds: float = 0.01) -> int:
        """A flow_group member."""
        label = f"sq{x}"
        exec_id = gauge.enter(label)
        try:
            time.sleep(seconds)
        finally:
            gauge.exit(exec_id, label)
        return x * x

    return app


class SlotsHarness(Harness):
    """A :class:`Harness` whose workers and client app run this module's project."""

    project = "tests.support.projects.slots"

    def backend(self) -> Any:
        """The test's admission backend, as every worker sees it."""
        from celery_flowcontrol import FlowControl

        return FlowControl(self.app).backend
