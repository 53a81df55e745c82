"""A concurrency cap is never exceeded across a fleet, measured by the tasks themselves.

The gauge's peak is exact (one Lua INCR per task entry, across every process of every node);
the interval sweep over the recorded start/end times says the same thing a second way.
"""

from __future__ import annotations

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import max_overlap


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.gated()
def test_cap_of_5_holds_across_two_nodes_of_4_processes_for_2000_tasks(make_harness: MakeHarness) -> None:
    """Redis broker, Redis result backend, Redis admission, SQLite parking: 8 pool processes
    compete for 5 slots; 2,000 tasks of 3 ms all run exactly once and never more than 5 at once."""
    h = make_harness(results=True, conf={"flowcontrol_queues": [{"name": "api", "concurrency": 5}]})
    h.start_worker(4)
    h.start_worker(4)
    labels = [f"c{i}" for i in range(2000)]
    for label in labels:
        h.send("work", label, 0.003, flow_queue="api")
    done = h.wait_done(labels, timeout=120)
    runs = h.gauge.executions()
    assert h.gauge.peak() <= 5, f"cap 5 exceeded: {h.gauge.peak()} task bodies ran at once"
    assert max_overlap(runs) <= 5
    assert h.gauge.peak() >= 3, "the fleet never ran tasks in parallel: the cap is not being used"
    twice = {label: n for label, n in done.items() if n != 1}
    assert not twice, f"tasks ran more than once without any crash: {list(twice.items())[:5]}"
    assert len(runs) == 2000
    assert h.parked("api") == 0


@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_cap_holds_on_rabbitmq_with_postgres_parking(make_harness: MakeHarness) -> None:
    """The same on RabbitMQ (AMQP acks and redeliveries) with the parking table on PostgreSQL:
    cap 3 over 2 nodes x 3 processes, 300 tasks of 5 ms."""
    h = make_harness(
        broker="rabbitmq", parking="postgres", conf={"flowcontrol_queues": [{"name": "api", "concurrency": 3}]}
    )
    h.start_worker(3)
    h.start_worker(3)
    labels = [f"r{i}" for i in range(300)]
    for label in labels:
        h.send("work", label, 0.005, flow_queue="api")
    done = h.wait_done(labels, timeout=60)
    assert h.gauge.peak() <= 3, f"cap 3 exceeded: {h.gauge.peak()} task bodies ran at once"
    assert max_overlap(h.gauge.executions()) <= 3
    assert h.gauge.peak() >= 2
    assert set(done.values()) == {1}
    assert h.parked("api") == 0
