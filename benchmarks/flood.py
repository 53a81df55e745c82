"""A flood: the backlog drained into the parking table, and a small tenant's wait behind it.

Flow queue ``flood`` (cap 1, ``fairness="key"``, Redis admission and broker, SQLite parking),
two worker nodes (``-P prefork -c 2``), tasks of 20 ms.

1. Drain: tenant ``a``'s backlog (20,000 tasks) waits in the broker (one client sends slower
   than the workers drain, so it is sent first); then both nodes start, the queue runs (its
   line moves: a task admitted every ~25 ms) and the workers take the backlog out of the
   broker into the parking table (counted from the first 1,000 drained, the nodes started
   without waiting for either to be ready). Most of it goes through each node's drainer
   (worker/drain.py: on kombu's Redis transport a flooded queue's messages are taken off the
   broker's list up to 200 at a time, admitted in one round trip, committed in one transaction
   and acked in one round trip), the rest through the consumer (worker/linger.py, parked in
   batches by worker/parkbatch.py). Figures: messages drained out of the broker per second
   (from the first 1,000 until the broker's queue is empty; nearly all of them parked, the
   rest lingering or run), against raw parking inserts (one row per transaction, the same
   row, the same database file, from this process: what the table itself allows; target:
   >= 0.5 x); the worker main process's RSS after the first 1,000 drained and once the broker
   is empty (target: growth <= 20 MB, the backlog costs no worker memory).
   Bound (info), the same backlog taken out of the broker by the same two nodes with flow
   control off and each message acked unrun by its strategy
   (tests/support/projects/acked.py): the least a Celery worker does with a message (kombu's
   fetch and unacked bookkeeping, Celery's decoding into the task's handler, the ack). It
   bounds a drain through Celery's consumer only; the drainer goes beside the consumer, so
   the drain may pass it.
2. Flood wait: with :data:`BACKLOG` of tenant ``a``'s tasks queued and more arriving, tenant
   ``b`` sends 5 tasks; its wait is from its send to each task's start (the gauge). Baseline:
   plain Celery, the same tasks on one plain pool process (what cap 1 means without flow
   control: FIFO, behind the whole backlog). Target: ours <= 0.1 x plain Celery's.

    python -m benchmarks.flood            # drain 20,000
    python -m benchmarks.flood --quick    # drain 5,000
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import asdict
from typing import Any

from benchmarks._fleet import Row, fleet, parser, rss_kb, table
from tests.support.harness import Harness, wait_for

TASK_SECONDS = 0.02
BACKLOG = 300
SMALL = 5
QUEUE = {"name": "flood", "concurrency": 1, "fairness": "key"}


def send_many(h: Harness, count: int, tenant: str, queue: str | None = "flood") -> None:
    """``count`` tasks of *tenant* (labels ``<tenant><n>``), as fast as one client sends."""
    options: dict[str, Any] = {"flow_queue": queue, "fairness_key": f"tenant-{tenant}"} if queue else {}
    task = h.app.tasks["proj.work"]
    with h.app.producer_or_acquire() as producer:
        for i in range(count):
            task.apply_async((f"{tenant}{i}", TASK_SECONDS), producer=producer, **options)


def raw_inserts(h: Harness, count: int) -> float:
    """Rows per second of one plain INSERT + COMMIT each, on the test's parking database."""
    from sqlalchemy import create_engine, insert

    from celery_flowcontrol.parking.model import ParkedRow

    template = h.store().list("flood", 1)[0]
    base = {k: v for k, v in asdict(template).items() if k != "seq"}
    for k in ("headers", "properties", "delivery_info"):
        if isinstance(base.get(k), dict):
            from celery_flowcontrol.parking.model import encode_json

            base[k] = encode_json(base[k])
    engine = create_engine(h.conf["flowcontrol_parking_url"])
    statement = insert(ParkedRow.__table__)
    began = time.perf_counter()
    with engine.connect() as conn:
        for i in range(count):
            with conn.begin():
                conn.execute(statement, {**base, "task_id": f"raw-{i}-{uuid.uuid4().hex[:8]}",
                                         "queue": "raw"})
    rate = count / (time.perf_counter() - began)
    engine.dispose()
    return rate


def drain(count: int) -> tuple[float, float, float, float, int]:
    """(messages drained out of the broker per second, raw inserts/s, RSS MB after the first
    1,000 drained, RSS MB once the broker is empty, parked then)."""
    with fleet({"flowcontrol_queues": [QUEUE], "flowcontrol_bulk_drain": True}) as h:
        # The backlog waits in the broker first: one client sends slower than workers drain.
        send_many(h, count, "a")
        # Not waiting for each to say it is ready: the first one drains meanwhile, and the
        # figure is counted from the first 1,000 drained, whenever that is.
        w1 = h.start_worker(2, name="w1", wait=False)
        h.start_worker(2, name="w2", wait=False)
        first = min(1000, count // 2)
        wait_for(lambda: h.ready() <= count - first, 300, 0.02, f"{first} drained")
        began, rss0, depth0 = time.perf_counter(), rss_kb(w1.proc.pid), h.ready()
        wait_for(lambda: h.ready() == 0, 600, 0.02, "the broker queue to empty")
        seconds = time.perf_counter() - began
        rss1, parked = rss_kb(w1.proc.pid), h.parked("flood")
        raw = raw_inserts(h, 2000)
    return depth0 / seconds, raw, rss0 / 1024, rss1 / 1024, parked


def bound(count: int) -> float:
    """Messages per second the two nodes take out of the broker when each is acked unrun."""
    from tests.support.projects.acked import AckedHarness

    with fleet({}, flow=False, kind=AckedHarness) as h:
        send_many(h, count, "a", None)
        h.start_worker(2, name="w1", wait=False)
        h.start_worker(2, name="w2", wait=False)
        first = min(1000, count // 2)
        wait_for(lambda: h.ready() <= count - first, 300, 0.02, f"{first} acked")
        began, depth0 = time.perf_counter(), h.ready()
        wait_for(lambda: h.ready() == 0, 600, 0.02, "the broker queue to empty")
        return depth0 / (time.perf_counter() - began)


def small_wait(flow: bool) -> list[float]:
    """Seconds from the small tenant's send to each of its tasks' start."""
    conf = {"flowcontrol_queues": [QUEUE]} if flow else {}
    with fleet(conf, flow=flow) as h:
        if flow:
            h.start_worker(2, name="w1")
            h.start_worker(2, name="w2")
        else:
            h.start_worker(1, name="w1")
        send_many(h, BACKLOG, "a", "flood" if flow else None)
        wait_for(lambda: h.gauge.started() >= 5, 30, what="the flood to run")
        time.sleep(1.0)
        arrival = time.time()
        send_many(h, SMALL, "b", "flood" if flow else None)
        labels = [f"b{i}" for i in range(SMALL)]
        h.wait_done(labels, timeout=120)
        starts = {r.label: r.start for r in h.gauge.executions() if r.label in labels}
    return [starts[label] - arrival for label in labels]


def main(quick: bool = False) -> bool:
    """Both parts; print the table; True when every target is met."""
    count = 5_000 if quick else 20_000
    rate, raw, rss0, rss1, parked = drain(count)
    least = bound(count)
    ours, plain = small_wait(True), small_wait(False)
    o50, p50 = statistics.median(ours), statistics.median(plain)
    omax, pmax = max(ours), max(plain)
    growth = rss1 - rss0
    rows = [
        Row(f"drain: out of the broker per second ({parked:,} parked)", rate, raw, "msg/s", rate / raw,
            ">= 0.5 x raw", rate / raw >= 0.5),
        Row("(info) bound: acked unrun by Celery's consumer", least, raw, "msg/s", least / raw, "info", True),
        Row("(info) drain vs that bound", rate, least, "msg/s", rate / least, "info", True),
        Row("drain: worker main RSS growth", growth, rss0, "MB", None, "<= 20 MB", growth <= 20),
        Row("flood: small tenant's wait, median", o50, p50, "s", o50 / p50, "<= 0.1 x plain", o50 / p50 <= 0.1),
        Row("flood: small tenant's wait, last task", omax, pmax, "s", omax / pmax, "<= 0.1 x plain",
            omax / pmax <= 0.1),
    ]
    print(table(f"flood: cap 1, fairness by key, tasks of {TASK_SECONDS * 1000:.0f} ms (baseline: raw "
                "inserts; plain Celery on one process)", rows))
    print(f"RSS of w1's main process: {rss0:.1f} MB after the first parks, {rss1:.1f} MB at the end")
    return all(r.ok for r in rows)


if __name__ == "__main__":
    args = parser(__doc__.splitlines()[0] if __doc__ else None).parse_args()
    raise SystemExit(0 if main(quick=args.quick) else 1)
