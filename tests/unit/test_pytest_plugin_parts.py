"""The pytest plugin's parts that need no worker: the app's clock, the worker's timer."""

from __future__ import annotations

import pickle
import time
from datetime import datetime, timezone

from celery_flowcontrol.pytest import FlowControlTestApp, clocked_timer
from celery_flowcontrol.testing import FakeClock


def test_the_app_tells_time_by_the_test_clock_and_keeps_it_through_pickling() -> None:
    clock = FakeClock(1_800_000_000.0)
    app = FlowControlTestApp("clocked", clock=clock, set_as_current=False)
    assert app.now() == datetime.fromtimestamp(1_800_000_000.0, timezone.utc)
    clock.advance(61)
    again = pickle.loads(pickle.dumps(app))
    assert again.now().timestamp() == 1_800_000_061.0


def test_the_timer_waits_out_an_eta_by_the_test_clock() -> None:
    clock = FakeClock(time.time() - 3600)  # the test clock an hour behind the wall clock
    timer = clocked_timer(clock)()
    try:
        # An ETA 30 s ahead of the test clock, handed over as Celery does (monotonic scale).
        eta_wall = clock() + 30
        timer.call_at(eta_wall - time.time() + time.monotonic(), lambda: None)
        (when, _, _), = timer.schedule.queue
        assert 29 < when - time.monotonic() <= 30.5, "30 s by the test clock, not -3570 s"
    finally:
        timer.stop()
