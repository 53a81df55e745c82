"""100,000 parked tasks: a worker's memory and the cost of admission stay flat.

A parked task is a SQL row and a waiter in the admission backend; nothing of it should live in
worker memory. One worker (``-P prefork -c 4``, Redis broker and admission, SQLite parking)
serves flow queues ``mem`` and ``empty`` (cap 1 each, retry 500 s so nobody re-polls during the run); a gate
task holds each slot, so everything sent afterwards is denied and parked.

1. Warm-up: 200 tasks parked through the worker; its RSS (main process, where admission and
   parking run, and the pool) is the baseline.
2. Baseline cost on the empty queue: (a) one admission decision, timed from this process on
   the same backend (deny + withdraw, 300 times); (b) 200 tasks denied and parked by the worker.
3. Fill: 100,000 rows into the parking table (one bulk insert, copies of a real parked message)
   and 100,000 waiters into the backend (real ``try_admit`` calls), all on ``mem``.
4. The same two costs on ``mem``, then the worker's RSS again after a few poll cycles.

Targets: RSS growth <= 20 MB; admission cost <= 2x the empty queue's.

    python -m benchmarks.parked_memory            # 100,000 parked
    python -m benchmarks.parked_memory --quick    # 20,000
"""

from __future__ import annotations

import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

from benchmarks._fleet import REDIS_URL, Row, children, fleet, parser, percentile, rss_kb, table
from tests.support.harness import Harness, wait_for

PROBES = 300
BATCH = 200


def probe(backend: Any, queue: str) -> list[float]:
    """Milliseconds of one denied admission (the waiter is withdrawn again, untimed)."""
    from celery_flowcontrol.admission import Ticket

    costs = []
    for i in range(PROBES):
        ticket = Ticket(queue, f"probe-{i}-{uuid.uuid4().hex[:6]}", "bench-probe")
        began = time.perf_counter()
        decision = backend.try_admit(ticket)
        costs.append((time.perf_counter() - began) * 1000)
        assert not decision.admitted, "the probe was admitted: the gate task does not hold the slot"
        backend.withdraw(queue, ticket.task_id)
    return costs


def park_batch(h: Harness, queue: str, expect: int) -> float:
    """Seconds for the worker to deny and park ``BATCH`` tasks sent to ``queue``."""
    began = time.perf_counter()
    for i in range(BATCH):
        h.send("work", f"{queue}-{uuid.uuid4().hex[:8]}-{i}", flow_queue=queue)
    wait_for(lambda: h.parked(queue) >= expect, 300, 0.02, f"{expect} parked in {queue}")
    return time.perf_counter() - began


def fill(h: Harness, backend: Any, count: int) -> None:
    """``count`` parked rows (bulk) and ``count`` backend waiters on ``mem``."""
    from sqlalchemy import create_engine, insert

    from celery_flowcontrol.admission import Ticket
    from celery_flowcontrol.parking.model import ParkedRow, encode_json

    template = h.store().list("mem", 1)[0]
    now = time.time()
    ids = [f"fill-{i}-{uuid.uuid4().hex[:12]}" for i in range(count)]
    base = asdict(template)
    rows = []
    for i, task_id in enumerate(ids):
        row = {k: v for k, v in base.items() if k not in ("seq",)}
        row.update(task_id=task_id, wake_at=now + 500, parked_at=now, claimed_until=None,
                   headers=encode_json({**template.headers, "id": task_id, "root_id": task_id}),
                   properties=encode_json({**template.properties, "correlation_id": task_id}),
                   fairness_key=task_id, priority=i % 10)  # fmt: skip
        rows.append(row)
    engine = create_engine(h.conf["flowcontrol_parking_url"])
    with engine.begin() as conn:
        for i in range(0, len(rows), 5000):
            conn.execute(insert(ParkedRow.__table__), rows[i : i + 5000])
    engine.dispose()

    def deny(task_id: str) -> None:
        backend.try_admit(Ticket("mem", task_id, "bench-fill", int(task_id.split("-")[1]) % 10, task_id))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(deny, ids, chunksize=500))


def worker_rss(h: Harness) -> tuple[int, int]:
    """(main process RSS, main plus pool RSS) of the harness's worker, in KiB."""
    pid = h.nodes[0].proc.pid
    main = rss_kb(pid)
    return main, main + sum(rss_kb(child) for child in children(pid))


def main(quick: bool = False) -> bool:
    """Run the four steps; print the table; True when both targets are met."""
    from celery_flowcontrol.admission import backend_from_url

    count = 20_000 if quick else 100_000
    queues = [{"name": name, "concurrency": 1, "retry": 500} for name in ("mem", "empty")]
    with fleet({"flowcontrol_queues": queues}) as h:
        backend = backend_from_url(REDIS_URL, key_prefix=h.prefix)
        # 2 processes for the gates and 2 more: with prefetch 1 a worker takes a message only
        # while a process is free, parked ones included.
        h.start_worker(4)
        h.send("gate", "gate-mem", 600.0, flow_queue="mem")
        h.send("gate", "gate-empty", 600.0, flow_queue="empty")
        wait_for(lambda: h.gauge.started() == 2, 30, what="both gate tasks to start")
        park_batch(h, "mem", BATCH)
        time.sleep(2)
        rss0, total0 = worker_rss(h)
        empty_probe = probe(backend, "empty")
        empty_park = park_batch(h, "empty", BATCH)
        began = time.perf_counter()
        fill(h, backend, count)
        filled_in = time.perf_counter() - began
        assert backend.stats("mem").waiting >= count, backend.stats("mem")
        full_probe = probe(backend, "mem")
        full_park = park_batch(h, "mem", count + 2 * BATCH)
        time.sleep(3)  # a few poll cycles over the full table
        rss1, total1 = worker_rss(h)
        parked = h.parked("mem")
        backend.close()
    e50, f50 = statistics.median(empty_probe), statistics.median(full_probe)
    e95, f95 = percentile(empty_probe, 95), percentile(full_probe, 95)
    growth = (rss1 - rss0) / 1024
    rows = [
        Row("worker main RSS growth", growth, rss0 / 1024, "MB", None, "<= 20 MB", growth <= 20),
        Row("worker main + pool RSS growth", (total1 - total0) / 1024, total0 / 1024, "MB", None, "-", True),
        Row("admission decision p50", f50, e50, "ms", f50 / e50, "ratio <= 2", f50 / e50 <= 2),
        Row("admission decision p95", f95, e95, "ms", f95 / e95, "ratio <= 2", f95 / e95 <= 2),
        Row(
            f"worker: deny + park {BATCH} tasks",
            full_park,
            empty_park,
            "s",
            full_park / empty_park,
            "ratio <= 2",
            full_park / empty_park <= 2,
        ),  # fmt: skip
    ]
    print(table(f"parked memory: {parked:,} parked in 'mem' (baseline: empty queue, same worker)", rows))
    print(f"filled {count:,} rows and waiters in {filled_in:.1f} s; RSS in MB: main {rss0 / 1024:.1f} -> "
          f"{rss1 / 1024:.1f}, with pool {total0 / 1024:.1f} -> {total1 / 1024:.1f}")  # fmt: skip
    return all(r.ok for r in rows)


if __name__ == "__main__":
    args = parser(__doc__.splitlines()[0] if __doc__ else None).parse_args()
    raise SystemExit(0 if main(quick=args.quick) else 1)
