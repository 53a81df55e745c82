"""Wake throughput on RabbitMQ with publisher confirms and without, side by side.

A wake is what ``wake_due`` does to a due parked row: claim it, publish its message, delete the
row (SQLite, the store's defaults). With confirms (what a worker does) each publish is
``mandatory`` and waits for the broker's ack on a channel of the wake's own; without, the
message goes out on the pooled producer's channel unconfirmed (the path before confirms, kept
here by turning :func:`~celery_flowcontrol.compat.confirming` off). Arms alternate, each round
parks ``--rows`` rows (not timed) and times the passes that wake them all, so a noisy
neighbour on a shared machine hits both alike. Reported: rows woken per second, per arm
(median of the rounds), and the ratio.

    python -m benchmarks wake_confirms
    python benchmarks/wake_confirms.py [--rows 1000] [--rounds 4] [--broker URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from celery import Celery
from kombu import Exchange, Queue

from benchmarks import _fleet
from celery_flowcontrol.parking import ParkedMessage, ParkingStore
from celery_flowcontrol.worker import republish

DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


def rows(n: int, exchange: str, routing_key: str, round_id: str) -> list[ParkedMessage]:
    """*n* due rows shaped like small Celery tasks."""
    now = time.time()
    out = []
    for i in range(n):
        tid = f"{round_id}-{i:05d}"
        out.append(ParkedMessage(
            task_id=tid, queue="bench", body=b'[["user-42"], {"locale": "en"}, {"callbacks": null}]',
            wake_at=now - 1, task_name="app.tasks.send_mail", headers={"id": tid, "task": "app.tasks.send_mail"},
            properties={"delivery_mode": 2, "correlation_id": tid}, exchange=exchange,
            routing_key=routing_key))  # fmt: skip
    return out


def one_round(app: Celery, store: ParkingStore, queue: Queue, n: int, confirms: bool) -> float:
    """Rows woken per second by ``wake_due`` over *n* parked rows, with or without confirms."""
    for m in rows(n, queue.exchange.name, queue.routing_key, uuid.uuid4().hex[:8]):
        store.park(m)
    saved = republish.confirming
    if not confirms:
        republish.confirming = lambda producer: None  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        woken = 0
        while woken < n:
            woken += republish.wake_due(app, store, limit=200)
        elapsed = time.perf_counter() - start
    finally:
        republish.confirming = saved
    with app.connection_for_write() as conn:
        queue(conn.default_channel).purge()
    return n / elapsed


def main(quick: bool = False) -> bool:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--broker", default=DEFAULT_BROKER)
    args = parser.parse_args(sys.argv[1:])
    name = f"bench-confirms-{uuid.uuid4().hex[:8]}"
    app = Celery("wake_confirms", broker=args.broker, set_as_current=False)
    queue = Queue(name, Exchange(name), routing_key=name, durable=True)
    with app.connection_for_write() as conn:
        queue(conn.default_channel).declare()
    folder = tempfile.mkdtemp(prefix="wake-confirms-")
    store = ParkingStore(f"sqlite:///{Path(folder) / 'parked.sqlite3'}")
    rates: dict[bool, list[float]] = {True: [], False: []}
    try:
        one_round(app, store, queue, 100, True)  # warm-up: tables, connections, channels
        one_round(app, store, queue, 100, False)
        for _ in range(args.rounds):
            for confirms in (False, True):
                rates[confirms].append(one_round(app, store, queue, args.rows, confirms))
    finally:
        store.close()
        with app.connection_for_write() as conn:
            queue(conn.default_channel).delete()
    without, with_ = statistics.median(rates[False]), statistics.median(rates[True])
    print(_fleet.table(f"wake throughput on RabbitMQ + SQLite, {args.rows} rows x {args.rounds} rounds "
                       "(median; baseline: the same wakes unconfirmed)", [
        _fleet.Row("wake: rows woken, confirmed", with_, without, "/s", with_ / without, "- (the cost)", True),
    ]))  # fmt: skip
    for confirms in (False, True):
        print(f"  {'with' if confirms else 'without'} confirms, rounds: "
              + ", ".join(f"{r:.0f}/s" for r in rates[confirms]))
    return True


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
