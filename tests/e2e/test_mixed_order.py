"""FlowTasks keep their place among plain tasks in one broker queue (real prefork workers,
Redis and RabbitMQ), measured against plain Celery.

* **Uncontended**: 10 FlowTasks of a flow queue with room to spare, then 10 plain tasks, then
  10 of each alternating, all waiting in the broker before the worker starts. Plain Celery
  (every task plain) starts them in the order sent; so must the gated worker.
* **Contended**: a flow queue of capacity 1, its waiters parked at once (``flowcontrol_linger
  = 0``) or lingering first (the default), while a steady stream of plain tasks keeps a
  backlog in the same broker queue. Every
  FlowTask runs, one at a time, and each woken one starts within a few plain starts of the
  end of the one before it: a woken message is not sent to the back of the plain backlog
  (RabbitMQ: on a queue with ``x-max-priority``, ``task_queue_max_priority``).

docs/celery.md, "The order a task gets", is the rule these hold.
"""

from __future__ import annotations

import time

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import Harness, wait_for

#: (label, task): 10 FlowTasks, 10 plain ones, then 10 of each alternating.
SENT = ([(f"f{i}", "work") for i in range(10)] + [(f"p{i}", "plain_work") for i in range(10)]
        + [(f"{'f' if i % 2 == 0 else 'p'}{10 + i // 2}", "work" if i % 2 == 0 else "plain_work")
           for i in range(20)])
FLOW_TASKS = 6
FLOW_SECONDS = 0.3
PLAIN_SECONDS = 0.05
#: Plain tasks kept waiting in the broker while the FlowTasks are contended.
BACKLOG = 15
#: Most plain starts between one FlowTask's end and the next one's start: the pool's other
#: process keeps taking plain tasks while the grant travels, never the whole backlog.
MOST_BETWEEN = 8


def start_order(h: Harness, prefixes: str) -> list[str]:
    return [r.label for r in h.gauge.executions() if r.label[0] in prefixes]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
@pytest.mark.gated("open")
def test_flow_tasks_start_in_the_order_sent_among_plain_tasks(make_harness: MakeHarness,
                                                               broker: str) -> None:
    plain = make_harness(broker=broker, flow=False)
    gated = make_harness(broker=broker, conf={"flowcontrol_queues": [{"name": "open", "concurrency": 50}]})
    for h in (plain, gated):
        for label, task in SENT:
            options = {"flow_queue": "open"} if h.flow and task == "work" else {}
            h.send(task, label, 0.01, **options)
    nodes = [h.start_worker(1, wait=False) for h in (plain, gated)]
    labels = [label for label, _ in SENT]
    for h, node in zip((plain, gated), nodes, strict=True):
        h.wait_ready(node, timeout=60)
        h.wait_done(labels, timeout=60)
    assert start_order(plain, "fp") == labels, "plain Celery did not start them in the order sent"
    assert start_order(gated, "fp") == start_order(plain, "fp")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("linger", [0, None], ids=["parked", "lingering"])
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
@pytest.mark.gated("tight")
def test_woken_flow_tasks_are_not_starved_by_a_stream_of_plain_tasks(make_harness: MakeHarness,
                                                                     broker: str,
                                                                     linger: float | None) -> None:
    conf: dict[str, object] = {"flowcontrol_queues": [{"name": "tight", "concurrency": 1}],
                               "task_queue_max_priority": 10}
    if linger is not None:
        conf["flowcontrol_linger"] = linger
    h = make_harness(broker=broker, conf=conf)
    h.start_worker(2)
    flows = [f"f{i}" for i in range(FLOW_TASKS)]
    sent = 0

    def counts(field: str) -> list[int]:
        # One read of the FlowTasks' counts only: the stream makes the gauge's hashes long.
        return [int(n or 0) for n in h.gauge.client.hmget(h.gauge.key(field), flows)]

    def plain_started() -> int:
        return h.gauge.started() - sum(counts("runs"))

    def top_up() -> None:
        nonlocal sent
        while sent - plain_started() < BACKLOG:
            h.send("plain_work", f"p{sent}", PLAIN_SECONDS)
            sent += 1

    top_up()
    for label in flows:
        h.send("work", label, FLOW_SECONDS, flow_queue="tight")
    deadline = time.monotonic() + 60
    waiting_at_last = 0
    while time.monotonic() < deadline and not all(counts("done")):
        top_up()
        if counts("runs")[-1] and not waiting_at_last:
            waiting_at_last = sent - plain_started()
        time.sleep(0.02)
    done = [label for label, n in zip(flows, counts("done"), strict=True) if n]
    assert done == flows, (f"FlowTasks done {done} of {flows} after 60 s of plain traffic "
                           f"({plain_started()} plain tasks started)")
    wait_for(lambda: h.parked("tight") == 0, 10, what="no FlowTask left parked")
    assert waiting_at_last >= BACKLOG // 2, "the plain stream ran dry: nothing was contended"

    runs = h.gauge.executions()
    ends = {r.label: r.end for r in runs if r.label in flows}
    starts = {r.label: r.start for r in runs if r.label in flows}
    order = sorted(flows, key=lambda label: starts[label])
    between = []
    for before, after in zip(order, order[1:], strict=False):
        end, start = ends[before] or 0.0, starts[after]
        between.append(sum(1 for r in runs if r.label[0] == "p" and end < r.start < start))
    assert max(between) <= MOST_BETWEEN, (
        f"plain tasks started between one FlowTask's end and the next one's start: {between}")
    assert h.store().dead_letters() == []
