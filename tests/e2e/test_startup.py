"""A real ``celery worker`` at boot: parking tables missing on PostgreSQL (it says so once, with
the command, takes no message, and starts once they exist), a parking URL of a wrong dialect
(it stops at once, naming the setting), an admission backend nobody serves (retried, logged
once a retry, then it stops)."""

from __future__ import annotations

import time

import pytest

from celery_flowcontrol.parking import migrate
from tests.support.fixtures import MakeHarness
from tests.support.harness import wait_for
from tests.support.services import free_port

QUEUES = [{"name": "boot", "concurrency": 2}]


@pytest.mark.timeout(120)
def test_missing_tables_hold_the_worker_until_migrate(make_harness: MakeHarness, postgres_url: str) -> None:
    h = make_harness(conf={"flowcontrol_queues": QUEUES, "flowcontrol_parking_url": postgres_url})
    w = h.start_worker(2, wait=False)
    wait_for(lambda: "are missing" in w.text(), 45, what="the worker to say the tables are missing")
    task_id = h.send("work", "early", flow_queue="boot")
    wait_for(lambda: h.in_broker(task_id), 10, what="the task to be in the broker")
    # Meanwhile the worker takes nothing: seconds later the message is still in the broker,
    # unrun, and the worker still waits (not ready, not dead).
    time.sleep(3)
    assert h.in_broker(task_id) and w.alive() and "ready." not in w.text() and h.gauge.done() == {}
    migrate(postgres_url)  # `celery -A proj flowcontrol migrate`
    h.wait_ready(w, timeout=45)
    h.wait_done(["early"], timeout=30)
    log = w.text()
    assert log.count("are missing") == 1 and "`celery -A proj flowcontrol migrate`" in log
    assert "the parking tables exist now" in log
    assert "unreachable" not in log  # never taken for an outage


@pytest.mark.timeout(90)
def test_a_wrong_parking_dialect_stops_the_worker_at_once(make_harness: MakeHarness) -> None:
    h = make_harness(conf={"flowcontrol_queues": QUEUES, "flowcontrol_parking_url": "postgres://app@127.0.0.1/app"})
    w = h.start_worker(1, wait=False)
    wait_for(lambda: not w.alive(), 45, what="the worker to stop")
    log = w.text()
    assert w.proc.returncode != 0
    assert "flowcontrol_parking_url" in log and "did you mean postgresql+psycopg://" in log
    assert "retrying" not in log and "unreachable" not in log


@pytest.mark.timeout(90)
def test_an_unreachable_backend_is_retried_then_stops_the_worker(make_harness: MakeHarness) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    h = make_harness(conf={"flowcontrol_queues": QUEUES, "flowcontrol_backend_url": dead,
                           "flowcontrol_backend_connection_max_retries": 2})
    w = h.start_worker(1, wait=False)
    wait_for(lambda: not w.alive(), 60, what="the worker to give up")  # 2 s, then 4 s
    log = w.text()
    assert log.count("unreachable at startup (") == 2
    assert "trying again in 2.00 seconds... (1/2)" in log and "(2/2)" in log
    assert "after 2 retries (flowcontrol_backend_connection_max_retries)" in log
    assert "ready." not in log
