"""The drainer (worker/drain.py) on real prefork workers and a real Redis broker.

The story: a capped flow queue's backlog waits in the broker, interleaved with plain tasks; its
line is held (a gate task holds the one slot) and nothing lingers, so every denial is parked.
Under a continuous flood (the queue running while calls keep coming, two tenants, lingering on)
the drainer takes an ordered queue's backlog while it runs, and the same holds.
The drainer takes the flow queue's messages off the broker's list in bulk, but never past a
plain task, which the consumer runs in its turn: every task runs exactly once, the plain tasks
in the order they were sent, and the drainer's count says it took messages. A warm shutdown in
the middle of the flood leaves nothing in kombu's unacked hash and loses nothing.
"""

from __future__ import annotations

import time

import pytest
import redis

from tests.support.fixtures import MakeHarness
from tests.support.harness import Harness, wait_for

FLOOD = 600
PLAIN_EVERY = 50
CONF = {"flowcontrol_queues": [{"name": "flood", "concurrency": 1}], "flowcontrol_linger": 0,
        "flowcontrol_bulk_drain": True}


def send_backlog(h: Harness, count: int, seconds: float = 0.0, tenants: int = 1,
                 first: int = 0) -> tuple[list[str], list[str]]:
    """``count`` flow tasks (of *seconds* each, round robin over *tenants*) with a plain task
    every :data:`PLAIN_EVERY`: (flow, plain) labels, numbered from *first*."""
    flow, plain = [], []
    work, plain_work = h.app.tasks["proj.work"], h.app.tasks["proj.plain_work"]
    with h.app.producer_or_acquire() as producer:
        for i in range(first, first + count):
            if i % PLAIN_EVERY == PLAIN_EVERY - 1:
                plain.append(f"p{i}")
                plain_work.apply_async((plain[-1],), producer=producer, queue=h.queue_name)
            flow.append(f"a{i}")
            work.apply_async((flow[-1], seconds), producer=producer, flow_queue="flood",
                             fairness_key=f"tenant-{i % tenants}")
    return flow, plain


def flow_peak(h: Harness) -> int:
    """The most flow tasks (labels ``a...``) seen running at once."""
    edges = sorted((t, d) for r in h.gauge.executions() if r.label.startswith("a") and r.end
                   for t, d in ((r.start, 1), (r.end, -1)))
    peak = running = 0
    for _, d in edges:
        running += d
        peak = max(peak, running)
    return peak


def drained(h: Harness) -> int:
    """How many messages this test's nodes parked by their drainer (their stats)."""
    replies = h.app.control.broadcast("flowcontrol_stats", reply=True, timeout=5)
    figures = {reply["admission"]["instance"]: reply["admission"] for answer in replies
               for node, reply in answer.items() if node.startswith(h.prefix)}
    return sum(f.get("drained", 0) for f in figures.values())


def unacked(h: Harness) -> int:
    client = redis.Redis.from_url(h.broker_url)
    try:
        return int(client.hlen(f"{h.prefix}:unacked"))
    finally:
        client.close()


@pytest.mark.gated()
@pytest.mark.timeout(240)
def test_a_flood_drains_in_bulk_and_plain_tasks_keep_their_turn(make_harness: MakeHarness) -> None:
    h = make_harness(broker="redis", conf=CONF)
    h.send("gate", "g0", 120.0, flow_queue="flood", fairness_key="tenant-g")
    flow, plain = send_backlog(h, FLOOD)
    h.start_worker(2, name="w1")
    wait_for(lambda: h.parked("flood") == FLOOD, 90, 0.1, "the whole backlog to be parked")
    h.wait_done(plain, timeout=60)
    assert drained(h) > FLOOD // 2, "the drainer took most of the backlog"
    starts = {r.label: r.start for r in h.gauge.executions() if r.label in plain}
    assert sorted(plain, key=starts.__getitem__) == plain, "plain tasks ran in the order sent"
    h.gauge.open_gate()
    h.wait_done(flow, timeout=150)
    runs = h.gauge.runs()
    assert all(runs[label] == 1 for label in flow + plain), "every task ran once, none was lost"
    assert h.gauge.peak() <= 2, "the cap held (the flow queue's one slot, and one plain task)"
    wait_for(lambda: h.parked() == 0, 10, 0.1, "no row left behind")
    assert unacked(h) == 0


@pytest.mark.gated()
@pytest.mark.timeout(240)
def test_a_warm_shutdown_mid_flood_leaves_nothing_unacked_and_loses_nothing(
        make_harness: MakeHarness) -> None:
    # A wider cap: the whole backlog runs within the test once the line opens.
    h = make_harness(broker="redis", conf={**CONF, "flowcontrol_queues": [
        {"name": "flood", "concurrency": 20}]})
    for i in range(20):
        h.send("gate", f"g{i}", 120.0, flow_queue="flood", fairness_key="tenant-g")
    count = 3000
    flow, plain = send_backlog(h, count)
    w1 = h.start_worker(24, name="w1")
    wait_for(lambda: h.parked("flood") >= 300, 60, 0.01, "the drain to be under way")
    h.gauge.open_gate()  # the gate task ends: the warm shutdown waits for no long task
    h.stop(w1)  # SIGTERM: Celery's warm shutdown, mid-flood
    assert w1.proc.returncode == 0, "a warm shutdown, not a kill"
    assert unacked(h) == 0, "the drainer gave back or acked all it took"
    print(f"stopped with {h.parked('flood')} of {count} parked, {h.ready()} in the broker")
    h.start_worker(24, name="w2")
    h.wait_done(flow + plain, timeout=180)
    time.sleep(1.0)
    runs = h.gauge.runs()
    assert all(runs[label] == 1 for label in flow), "every flow task ran once, none was lost"
    assert drained(h) > 0


@pytest.mark.gated()
@pytest.mark.timeout(240)
def test_a_continuous_flood_of_an_ordered_queue_is_drained_while_it_runs(
        make_harness: MakeHarness) -> None:
    h = make_harness(broker="redis", conf={"flowcontrol_bulk_drain": True, "flowcontrol_queues": [
        {"name": "flood", "concurrency": 2, "fairness": "key"}]})
    h.start_worker(4, name="w1")
    flow, plain = [], []
    for wave in range(6):  # calls keep coming faster than the queue runs them
        f, p = send_backlog(h, 300, 0.005, tenants=2, first=wave * 300)
        flow += f
        plain += p
        time.sleep(0.3)
    h.wait_done(flow + plain, timeout=180)
    time.sleep(1.0)
    runs = h.gauge.runs()
    assert all(runs[label] == 1 for label in flow + plain), "every task ran once, none was lost"
    assert drained(h) > 0, "the drainer took part of the flood while the queue ran"
    assert flow_peak(h) <= 2, "the cap held"
    starts = {r.label: r.start for r in h.gauge.executions() if r.label in plain}
    assert sorted(plain, key=starts.__getitem__) == plain, "plain tasks ran in the order sent"
    wait_for(lambda: h.parked() == 0, 10, 0.1, "no row left behind")
    assert unacked(h) == 0


@pytest.mark.gated()
@pytest.mark.timeout(120)
def test_without_bulk_drain_the_consumer_parks_the_flood_alone(make_harness: MakeHarness) -> None:
    conf = {k: v for k, v in CONF.items() if k != "flowcontrol_bulk_drain"}  # off by default
    h = make_harness(broker="redis", conf=conf)
    h.send("gate", "g0", 120.0, flow_queue="flood", fairness_key="tenant-g")
    flow, plain = send_backlog(h, 200)
    h.start_worker(2, name="w1")
    wait_for(lambda: h.parked("flood") == 200, 60, 0.1, "the whole backlog to be parked")
    assert drained(h) == 0, "the drainer is opt-in: every park went through the consumer"
    h.gauge.open_gate()
    h.wait_done(flow + plain, timeout=60)
    order = [r.label for r in h.gauge.executions() if r.label in flow]
    assert order == flow, "one line, one priority: run in the order sent"
