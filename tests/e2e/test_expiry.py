"""Expiry keeps Celery's meaning through parking, on real prefork workers (Redis and RabbitMQ).

* A task parked for a slot whose ``expires`` passes meanwhile is not run: it ends REVOKED in
  the result backend and ``task_revoked`` fires with ``expired=True``, as an expired task does
  in plain Celery; a woken one that has time left runs.
* A retry with a countdown and an expiry (parked until its ETA) runs again and succeeds: the
  stored TTL once came back multiplied by 1000 at every park, until kombu refused it forever.
* Celery's own way to add a bootstep, ``app.steps["consumer"].add(FlowControlStep)`` with the
  settings in ``app.conf``, installs flow control alone: the cap holds, denied tasks park and
  come back.
"""

from __future__ import annotations

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import max_overlap, wait_for
from tests.support.projects.base import revocations


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
@pytest.mark.timeout(120)
@pytest.mark.gated()
def test_a_task_that_expires_while_parked_is_revoked_as_expired(make_harness: MakeHarness, broker: str) -> None:
    h = make_harness(broker=broker, results=True,
                     conf={"flowcontrol_queues": [{"name": "exp", "concurrency": 1, "retry": "30s"}]})
    h.start_worker(2)
    h.send("gate", "gate0", flow_queue="exp")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the gate task to hold the one slot")
    short = h.send("work", "short", expires=2, flow_queue="exp")
    long = h.send("work", "long", expires=120, flow_queue="exp")
    wait_for(lambda: h.parked("exp") == 2, 20, what="both tasks to be parked")
    # Its row wakes at its expiry (not at the 30 s retry), and the worker revokes it.
    wait_for(lambda: short in revocations(h.gauge), 20, what="the parked task's expiry to revoke it")
    h.gauge.open_gate()
    h.wait_done(["gate0", "long"], timeout=30)
    assert h.app.AsyncResult(short).state == "REVOKED"
    assert revocations(h.gauge) == {short: {"expired": True, "terminated": False}}
    assert h.app.AsyncResult(long).get(timeout=10) == "long"
    assert "short" not in h.gauge.done()
    assert h.parked("exp") == 0


@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_a_retry_with_countdown_and_expires_runs_again(make_harness: MakeHarness) -> None:
    h = make_harness(results=True, conf={"flowcontrol_queues": [{"name": "api", "concurrency": 50}]})
    h.start_worker(2)
    ids = [h.send("retry_once", f"r{i}", flow_queue="api") for i in range(5)]
    for task_id in ids:
        assert h.app.AsyncResult(task_id).get(timeout=30) == 1  # its retries count, once retried
    assert "waker failed" not in h.log_text()
    assert h.parked("api") == 0


@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_the_consumer_step_added_the_celery_way_installs_flow_control(make_harness: MakeHarness) -> None:
    h = make_harness(conf={"flowcontrol_queues": [{"name": "api", "concurrency": 2, "retry": "1s"}]})
    h.start_worker(4, env={"FCT_INSTALL": "step"})
    h.start_worker(4, env={"FCT_INSTALL": "step"})
    labels = [f"s{i}" for i in range(60)]
    for label in labels:
        h.send("work", label, 0.05, flow_queue="api")
    done = h.wait_done(labels, timeout=60)
    assert set(done.values()) == {1}
    assert h.gauge.peak() <= 2 and max_overlap(h.gauge.executions()) <= 2
    assert "FlowControl(app) was not called" not in h.log_text()
    assert "parks in" in h.log_text()  # each node's flow control started, without FlowControl(app)
