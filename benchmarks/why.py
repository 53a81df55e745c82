"""Why a task waits: what ``explain`` and ``flowcontrol_track_parked`` cost.

1. ``explain`` of the last of N waiters (default 100,000) of a cap-1 queue on the Redis
   admission backend, its row in SQLite: the median of 5 calls (target: < 0.5 s). It reads
   each store a fixed number of times (the queue's figures, its grants, its place in line:
   ``place``, a rank in the queue's one line; its busy slots), never once per waiter.
2. Parks per second with ``flowcontrol_track_parked`` off vs on, in the same run, alternating:
   what the worker's park path does per batch of denials (``ParkingStore.park_many`` of 100
   rows, then, when on, ``ParkedStates.committed``: the PARKED states of the batch in one
   Redis result-backend round trip, compat.py's ``store_states``); and the same with Celery's
   database result backend on SQLite (one transaction per batch there).

    python -m benchmarks.why [--waiters 100000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from celery import Celery

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import Ticket
from celery_flowcontrol.parked_state import ParkedStates
from celery_flowcontrol.parking import ParkedMessage
from celery_flowcontrol.views.explain import explain_task

REDIS = "redis://127.0.0.1:6379/0"
TARGET = 0.5
BATCH = 100


def make_app(tmp: Path, prefix: str, results: str = REDIS) -> Celery:
    app = Celery("bench_why", broker="memory://", backend=results, set_as_current=False)
    app.conf.update(flowcontrol_backend_url=REDIS, flowcontrol_key_prefix=prefix,
                    flowcontrol_parking_url=f"sqlite:///{tmp / 'park.sqlite3'}",
                    flowcontrol_queues=[{"name": "why", "concurrency": 1}],
                    result_expires=600)

    @app.task(name="bench_why.work", shared=False)
    def work() -> None:
        """The task whose calls are parked."""

    return app


def explain_behind(app: Celery, waiters: int) -> float:
    fc = FlowControl(app)
    for config in fc.settings.queues:
        fc.backend.register(config)
    fc.backend.try_admit(Ticket("why", "running", "bench/1/aa"))
    last = ""
    for i in range(waiters):
        last = f"w{i}"
        fc.backend.try_admit(Ticket("why", last, "bench/1/aa"))
    fc.store.park(ParkedMessage(task_id=last, queue="why", body=b"[]", wake_at=time.time() + 60))
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        out = explain_task(fc, last)
        times.append(time.perf_counter() - t0)
    assert out["position"] == waiters and out["where"] == "parked", out
    return statistics.median(times)


def parks_per_second(app: Celery, rounds: int) -> tuple[float, float]:
    fc = FlowControl(app)
    states = ParkedStates(app, enabled=True)
    rates: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds * 2):
        on = bool(r % 2)
        rows = [ParkedMessage(task_id=uuid.uuid4().hex, queue="why", body=b"[]",
                              task_name="bench_why.work", wake_at=time.time() + 600)
                for _ in range(BATCH * 10)]
        t0 = time.perf_counter()
        for i in range(0, len(rows), BATCH):
            batch = rows[i:i + BATCH]
            fc.store.park_many(batch)
            if on:
                states.committed(batch, time.time())
        rates[on].append(len(rows) / (time.perf_counter() - t0))
    assert states.written == rounds * BATCH * 10
    return statistics.median(rates[False]), statistics.median(rates[True])


def main(quick: bool = False) -> bool:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--waiters", type=int, default=20_000 if quick else 100_000)
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args([] if quick else None)
    prefix = f"bw{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        app = make_app(Path(tmp), prefix)
        took = explain_behind(app, args.waiters)
        off, on = parks_per_second(app, args.rounds)
        FlowControl(app).store.close()
        db_app = make_app(Path(tmp), prefix, f"db+sqlite:///{Path(tmp) / 'results.sqlite3'}")
        db_off, db_on = parks_per_second(db_app, max(1, args.rounds // 3))
        FlowControl(db_app).store.close()
    import redis

    client = redis.Redis.from_url(REDIS)
    for rkey in client.scan_iter(f"{prefix}*", count=1000):  # the queue's 100,000 waiters
        client.delete(rkey)
    print(f"explain behind {args.waiters:,} waiters (Redis backend, SQLite row): "
          f"{took * 1000:.0f} ms median of 5 (target < {TARGET * 1000:.0f} ms)")
    print(f"parks/s, batches of {BATCH}, SQLite: track_parked off {off:,.0f}, on {on:,.0f} "
          f"(on/off {on / off:.2f}; Redis result backend)")
    print(f"parks/s, batches of {BATCH}, SQLite: track_parked off {db_off:,.0f}, on {db_on:,.0f} "
          f"(on/off {db_on / db_off:.2f}; database result backend, SQLite)")
    return took < TARGET


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
