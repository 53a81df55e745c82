"""Wake latency: from the end of one task to the start of the parked waiter its slot goes to.

Flow queue ``one`` has a cap of 1 and the default retry tick of 1 s; one node of 4 prefork
processes, Redis broker and admission, SQLite parking. A first task holds the slot while the
others arrive and are parked; from then on every task that ends frees the slot for the next
waiter: release -> grant (pub/sub) -> claim the row -> republish -> broker -> admission -> pool.
The latency of one hand-over is the next body's start minus the previous body's end, both
measured by the tasks (so it also includes Celery's own result handling and dispatch).

Baseline, same run: plain Celery with one pool process (no flow control) running the same tasks
back to back, so the gap is Celery's own hand-over. Target: p95 <= 50 ms, where a
waiter that missed its wake would wait for the 1 s retry tick.

    python -m benchmarks.wake_latency           # 200 hand-overs
    python -m benchmarks.wake_latency --quick   # 60
"""

from __future__ import annotations

import statistics

from benchmarks._fleet import Row, fleet, parser, percentile, table
from tests.support.harness import Harness, wait_for

TASK_SECONDS = 0.02


def gaps(h: Harness, tasks: int, flow: bool) -> list[float]:
    """Run a gate task then ``tasks`` short ones; the start-minus-previous-end gaps in ms."""
    options = {"flow_queue": "one"} if flow else {}
    h.send("gate", "gate", **options)
    wait_for(lambda: h.gauge.started() == 1, 20, what="the first task to start")
    labels = [f"t{i}" for i in range(tasks)]
    for label in labels:
        h.send("work", label, TASK_SECONDS, **options)
    if flow:
        wait_for(lambda: h.parked("one") == tasks, 60, what=f"{tasks} waiters to be parked")
    h.gauge.open_gate()
    h.wait_done(labels, timeout=60 + tasks)
    runs = h.gauge.executions()
    return [(nxt.start - (prev.end or prev.start)) * 1000 for prev, nxt in zip(runs, runs[1:], strict=False)]


def main(quick: bool = False) -> bool:
    """Measure both fleets; print the table; True when the target is met."""
    tasks = 60 if quick else 200
    with fleet(flow=False) as h:
        h.start_worker(1)
        base = gaps(h, tasks, flow=False)
    conf = {"flowcontrol_queues": [{"name": "one", "concurrency": 1, "retry": 1.0}]}
    with fleet(conf) as h:
        h.start_worker(4)
        flow = gaps(h, tasks, flow=True)
    p50, p95, p99 = (percentile(flow, q) for q in (50, 95, 99))
    b50, b95, b99 = (percentile(base, q) for q in (50, 95, 99))
    rows = [
        Row("hand-over p50", p50, b50, "ms", p50 / b50 if b50 else None, "-", True),
        Row("hand-over p95", p95, b95, "ms", p95 / b95 if b95 else None, "<= 50 ms", p95 <= 50),
        Row("hand-over p99", p99, b99, "ms", p99 / b99 if b99 else None, "-", True),
        Row("hand-over max", max(flow), max(base), "ms", None, "< 1000 ms (no retry tick)", max(flow) < 1000),
        Row("hand-over mean", statistics.fmean(flow), statistics.fmean(base), "ms", None, "-", True),
    ]
    print(table(f"wake latency: cap 1, {tasks} parked waiters, retry tick 1 s (baseline: plain Celery -c 1)", rows))
    return all(r.ok for r in rows)


if __name__ == "__main__":
    args = parser(__doc__.splitlines()[0] if __doc__ else None).parse_args()
    raise SystemExit(0 if main(quick=args.quick) else 1)
