"""The harness itself, proven with plain Celery tasks (no flow control): the gauge sees the real
pool concurrency, every task finishes exactly once, and a ``kill -9`` of a node loses nothing."""

from __future__ import annotations

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import max_overlap, wait_for

pytestmark = pytest.mark.timeout(90)


def test_gauge_measures_the_fleets_concurrency(make_harness: MakeHarness) -> None:
    """2 nodes x 2 processes running 60 tasks of 50 ms: never more than 4 bodies at once,
    and the pools really are used in parallel."""
    h = make_harness(flow=False)
    h.start_worker(2)
    h.start_worker(2)
    labels = [f"t{i}" for i in range(60)]
    for label in labels:
        h.send("work", label, 0.05)
    done = h.wait_done(labels, timeout=30)
    assert set(done.values()) == {1}
    assert 3 <= h.gauge.peak() <= 4
    assert max_overlap(h.gauge.executions()) == h.gauge.peak()


def test_kill9_of_a_node_loses_nothing_on_rabbitmq(make_harness: MakeHarness) -> None:
    """acks_late on RabbitMQ: the tasks a killed node was running come back to the survivor."""
    h = make_harness(broker="rabbitmq", flow=False)
    victim = h.start_worker(2, env={"FCT_HOLD_SECONDS": "60"})
    h.send("hold", "h0")
    h.send("hold", "h1")
    wait_for(lambda: h.gauge.started() == 2, 20, what="both holds to start on the victim")
    h.kill9(victim)
    h.start_worker(2)
    done = h.wait_done(["h0", "h1"], timeout=30)
    assert done == {"h0": 1, "h1": 1}
    assert h.gauge.runs() == {"h0": 2, "h1": 2}


@pytest.mark.gated("api")
def test_the_admission_witness_counts_only_runs_admission_let_in(make_harness: MakeHarness) -> None:
    """A FlowTask sent with no flow queue, or with one no config names, runs ungated and leaves
    no trace in ``gauge.gated()``; one sent through a configured queue is counted there. The
    ``gated`` marker checks this record at teardown."""
    h = make_harness(conf={"flowcontrol_queues": [{"name": "api", "concurrency": 2}]})
    h.start_worker(2)
    h.send("work", "bypass", 0.0)
    h.send("work", "unknown", 0.0, flow_queue="nosuchqueue")
    h.wait_done(["bypass", "unknown"], timeout=30)
    assert h.gauge.gated() == {}
    assert h.gauge.runs() == {"bypass": 1, "unknown": 1}
    h.send("work", "in", 0.0, flow_queue="api")
    h.wait_done(["in"], timeout=30)
    assert h.gauge.gated() == {"api": 1}


def test_the_gated_marker_names_the_queues_no_run_was_admitted_in(make_harness: MakeHarness,
                                                                   request: pytest.FixtureRequest) -> None:
    """What teardown reports: the marker's patterns with no admitted run, or with no names each
    harness's configured queues it admitted nothing in."""
    from tests.support.fixtures import unadmitted_queues

    h = make_harness(conf={"flowcontrol_queues": [{"name": "api"}, {"name": "idle"}]})
    h.gauge.client.hincrby(h.gauge.key("gated"), "api", 1)
    request.node.add_marker(pytest.mark.gated("api", "a*", "fg.*"))
    assert unadmitted_queues(request.node, [h]) == ["fg.*"]
    request.node.own_markers.clear()
    request.node.add_marker(pytest.mark.gated())
    assert unadmitted_queues(request.node, [h]) == ["idle"]
    request.node.own_markers.clear()
    assert unadmitted_queues(request.node, [h]) == []
