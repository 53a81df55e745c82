"""One clock for an app's flow control: the ready backend's own, else the wall clock."""

from __future__ import annotations

import time

from celery import Celery

from celery_flowcontrol.admission.memory import MemoryBackend
from celery_flowcontrol.engines import Engines
from celery_flowcontrol.testing import FakeClock


def test_a_ready_backend_gives_its_clock_to_the_store_and_the_worker(tmp_path) -> None:
    clock = FakeClock()
    app = Celery("clocked", set_as_current=False)
    app.conf.update(flowcontrol_backend=MemoryBackend(clock=clock),
                    flowcontrol_parking_url=f"sqlite:///{tmp_path / 'p.sqlite3'}")
    engines = Engines(app)
    assert engines.clock is clock
    clock.advance(90)
    assert engines.store.clock() == engines.now() == clock() == 1_800_000_090.0


def test_a_backend_built_from_a_url_runs_on_the_wall_clock() -> None:
    app = Celery("wall", set_as_current=False)
    app.conf.flowcontrol_backend_url = "memory://"
    assert Engines(app).clock is time.time
