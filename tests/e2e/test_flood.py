"""Order over the whole backlog under a continuous flood (two prefork nodes, both brokers).

One tenant floods a ``fairness="key"`` queue: a backlog of hundreds sent at once, then more at
twice the rate the cap lets through (measured on the run), for the whole test (tasks of 20 ms
at cap 1, 50 ms at cap 4); nothing waits for the flood to be parked, no gate is closed. While
it runs, two small tenants send 5 tasks each, and later three tasks of a higher
``flow_priority`` are sent one by one behind the backlog.

The flood goes no faster than the fleet drains it out of the broker (:data:`AHEAD`), and the
small tenants, and each high-priority task, are sent once the broker holds none of its
messages: what comes after them in the broker is the flood, and what stands before them is
the backlog in the backend's line, which fairness and priority order. A flood published faster
than the fleet drains it leaves its excess in the broker, in the broker's order, which neither
a fairness key nor a ``flow_priority`` reorders (docs/worker.md, "A flood"); on a busy machine
the drain, which needs CPU, falls behind a flood paced by tasks that sleep, and counted from
the send the positions measured that excess, not the order. A drain that stops taking the
flood out of the broker fails the test (:data:`STALL`).

What must hold: every small-tenant task is among the first 3 x 3 tenants x 5 tasks
= 45 admissions after the small tenants arrive, and each high-priority task is among the first
``capacity + 2`` admissions after it **reached a worker and asked** (it entered the line). The
order of admissions is the order of the task bodies' starts (the gauge's records, one clock:
this machine's). The small tenants count from their send, by design: their bound is that of a
fair line, loose enough for their delivery. A high-priority task's bound is the line's head:
counted from its send, it also measured its delivery (publish, fetch, the consumer's loop
getting to it), during which the flood goes on starting tasks, so a busy machine's hiccup
counted as places in line. So it counts from the instant the worker's consumer handed its
message to the flow strategy, before the gate asked (recorded by the e2e project
:mod:`tests.support.projects.arrivals`): what starts after that and before it are the slots
granted but not yet started when it asked (up to ``capacity``), and any granted while its ask
travels to the backend. The first one's bound is the others' on Redis too: what the transport
fetched before it, in the broker's order, is delivery, now outside the count.

Before the flood drain (worker/linger.py raises the prefetch window for each lingering
waiter), a worker's window filled with lingering flood waiters, the rest of the backlog stayed
in the broker, and the small tenants ran after the whole flood, as with plain Celery.

The drain itself parks in batches (worker/parkbatch.py): a backlog waiting in the broker when
the nodes start is committed to the parking table several rows per transaction, and still every
task runs once, none is lost, and the cap holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import Harness, wait_for
from tests.support.projects.arrivals import HEADER as ARRIVAL
from tests.support.projects.arrivals import ArrivalsHarness

SMALL = ("b", "c")
PER_SMALL = 5
TENANTS = 1 + len(SMALL)
FAIR_BOUND = 3 * TENANTS * PER_SMALL
BACKLOG = 400
#: Task length by capacity: the flood's rate (twice what the cap lets through) stays below what
#: two nodes drain into the parking table on a busy 2-core machine (benchmarks/flood.py): a
#: flood faster than the drain leaves its excess in the broker, in the broker's order.
TASK_SECONDS = {1: 0.02, 4: 0.05}
#: The flood sends nothing while the broker holds this many of its messages: on a machine too
#: busy for the drain to keep up with it, the flood goes at the drain's pace (the rest of its
#: rate would only wait in the broker, in the broker's order).
AHEAD = 20
#: Seconds without one message taken out of the broker after which the drain counts as stuck.
STALL = 20.0


class Flood:
    """Publishes tenant ``a``'s flood: a backlog at once (``send``), then ``rate`` per second,
    as far as the drain keeps up (:data:`AHEAD`)."""

    def __init__(self, h: Harness, queue: str, rate: float, seconds: float) -> None:
        self.h, self.queue, self.rate, self.seconds = h, queue, rate, seconds
        self.sent = 0

    def send(self, n: int) -> None:
        for _ in range(n):
            self.h.send("work", f"a{self.sent}", self.seconds, flow_queue=self.queue,
                        fairness_key="tenant-a")
            self.sent += 1

    def run(self, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        """Keep flooding for *seconds* (or until *until*), at ``rate``."""
        end = last = time.monotonic()
        end += seconds
        owed = 0.0
        while time.monotonic() < end and not until():
            now = time.monotonic()
            owed += (now - last) * self.rate
            last = now
            if self.h.ready() >= AHEAD:
                owed = 0.0  # at the drain's pace (AHEAD), not in bursts once it caught up
            self.send(int(owed))
            owed -= int(owed)
            time.sleep(0.05)


def drained(h: Harness, sent: str) -> None:
    """Wait until the broker holds none of the test's messages (the module docstring says why),
    before *sent* is sent; the flood pauses meanwhile. A drain that stops taking them out of
    the broker for :data:`STALL` seconds fails the test; a slow one is waited for."""
    least, since = h.ready(), time.monotonic()
    while least:
        time.sleep(0.02)
        ready = h.ready()
        if ready < least:
            least, since = ready, time.monotonic()
        assert time.monotonic() - since < STALL, (
            f"the broker held {ready} of the flood's messages before {sent}: for {STALL:g} s "
            "the drain took none of them out")


def admissions_before(h: Harness, queue_prefixes: str, arrival: float, label: str) -> int:
    """How many executions started after *arrival* and before *label*'s first start."""
    runs = [r for r in h.gauge.executions() if r.label[0] in queue_prefixes]
    mine = min(r.start for r in runs if r.label == label)
    return sum(1 for r in runs if arrival < r.start < mine)


def send_urgent(h: Harness, flood: Flood, seconds: float) -> list[tuple[str, float]]:
    """Three tasks of ``flow_priority=5``, one by one behind the flood: (label, sent at)."""
    urgent = []
    for i in range(3):
        label = f"p{i}"
        drained(h, label)
        sent_at = time.time()
        h.send("work", label, seconds, flow_queue=flood.queue, fairness_key="tenant-a", flow_priority=5,
               headers={ARRIVAL: label})
        flood.run(30, until=lambda label=label: label in h.gauge.done())
        assert label in h.gauge.done(), f"{label} (flow_priority=5) did not run within 30 s"
        urgent.append((label, sent_at))
        flood.run(0.5)
    return urgent


@pytest.mark.gated()
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("broker", "capacity"), [("redis", 1), ("redis", 4), ("rabbitmq", 1), ("rabbitmq", 4)])
def test_small_tenants_and_high_priority_cut_through_a_continuous_flood(
        make_harness: MakeHarness, broker: str, capacity: int) -> None:
    queue = {"name": "flood", "concurrency": capacity, "fairness": "key"}
    h = make_harness(ArrivalsHarness, broker=broker, conf={"flowcontrol_queues": [queue]})
    h.start_worker(4, name="w1")
    h.start_worker(4, name="w2")
    seconds = TASK_SECONDS[capacity]
    # First at what the cap would let through on an idle machine (a task plus a ~10 ms
    # hand-over), then at twice what it does let through here, measured.
    flood = Flood(h, "flood", rate=capacity / (seconds + 0.01), seconds=seconds)
    flood.send(BACKLOG)
    wait_for(lambda: h.gauge.started() >= 3 * capacity, 30, what="the flood to run")
    before, began = h.gauge.started(), time.monotonic()
    flood.run(2.0)
    flood.rate = 2 * (h.gauge.started() - before) / (time.monotonic() - began)
    flood.run(1.0)

    drained(h, "the small tenants")
    arrival = time.time()
    small = []
    for tenant in SMALL:
        for i in range(PER_SMALL):
            small.append(f"{tenant}{i}")
            h.send("work", small[-1], seconds, flow_queue="flood", fairness_key=f"tenant-{tenant}")
    flood.run(60, until=lambda: set(small) <= set(h.gauge.done()))
    assert set(small) <= set(h.gauge.done()), "the small tenants' tasks did not run within 60 s"
    flood.run(1.0)

    urgent = send_urgent(h, flood, seconds)

    positions = {label: admissions_before(h, "abcp", arrival, label) for label in small}
    assert max(positions.values()) < FAIR_BOUND, (
        f"small tenants admitted after {positions} admissions (bound {FAIR_BOUND}); "
        f"flood sent {flood.sent}, parked now {h.parked('flood')}")
    # Counted from the instant each reached a worker and asked (the module docstring says why).
    arrived = h.gauge.arrivals()
    assert all(label in arrived for label, _ in urgent), f"arrivals recorded: {arrived}"
    waits = {label: admissions_before(h, "abcp", arrived[label], label) for label, _ in urgent}
    bound = capacity + 2
    assert max(waits.values()) < bound, (
        f"high-priority tasks admitted after {waits} admissions since they asked (bound {bound}); "
        f"from their send: { {label: admissions_before(h, 'abcp', at, label) for label, at in urgent} }, "
        f"delivered in (ms) { {label: round(1000 * (arrived[label] - at)) for label, at in urgent} }")



@pytest.mark.gated()
@pytest.mark.timeout(240)
@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_a_backlog_drains_into_parking_in_batches_and_every_task_runs_once(
        make_harness: MakeHarness, broker: str) -> None:
    capacity, count = 2, 300
    queue = {"name": "flood", "concurrency": capacity, "fairness": "key"}
    h = make_harness(broker=broker, conf={"flowcontrol_queues": [queue]})
    for i in range(capacity):  # they hold every slot until the gate opens: the line stands still
        h.send("gate", f"g{i}", 120.0, flow_queue="flood", fairness_key="tenant-g")
    flood = Flood(h, "flood", rate=0, seconds=0.01)
    flood.send(count)  # waits in the broker: no worker yet
    h.start_worker(2, name="w1")
    h.start_worker(2, name="w2")
    wait_for(lambda: h.parked("flood") == count, 90, 0.1, "the whole backlog to be parked")
    replies = h.app.control.broadcast("flowcontrol_stats", reply=True, timeout=5)
    # By worker instance, this test's nodes only (a reply may come twice, or from elsewhere).
    figures = {reply["admission"]["instance"]: reply["admission"] for answer in replies
               for node, reply in answer.items() if node.startswith(h.prefix)}
    parked = sum(f["parked"] for f in figures.values())
    batches = sum(f["park_batches"] for f in figures.values())
    assert parked >= count and 0 < batches < parked, (
        f"{parked} parks in {batches} batches: none committed together")
    print(f"{broker}: {parked} parks in {batches} batches")
    h.gauge.open_gate()
    labels = [f"a{i}" for i in range(count)]
    h.wait_done(labels, timeout=150)
    runs = h.gauge.runs()
    assert all(runs[label] == 1 for label in labels), "every task ran once, none was lost"
    assert h.gauge.peak() <= capacity, "the cap held"
    wait_for(lambda: h.parked() == 0, 10, 0.1, "no row left behind")
