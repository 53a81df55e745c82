"""``flow_batch``: calls per second through batches of 100 vs the same calls one by one, and
how late a batch forms after its ``wait``.

1. Throughput: ``--calls`` calls (default 2,000) of ``proj.doubles`` (``flow_batch`` size 100,
   wait 0.5 s) vs the same number of ``proj.double`` (a plain FlowTask, one run per call), on
   one prefork worker (concurrency 2) on the Redis broker, every result read back. Calls per
   second from the first ``delay`` to the last result. The baseline the issue names,
   celery-batches (``proj.cb_doubles``: ``Batches``, flush every 100 calls or 0.5 s), runs
   the same calls in the same run on the same broker, on a worker of its own with the
   prefetch it needs (``--prefetch-multiplier 100``: it buffers in worker memory), when it is
   installed: ``pip install -e '.[bench-baselines]'`` (its releases cap Celery, 0.11 below
   5.7, so it is in no other extra).
2. Formation latency: ``--lone`` single calls (default 20) of ``proj.lone`` (size 1000, wait
   0.5 s), one at a time: each batch forms at ``wait``; lateness is its run's start minus
   (the call's publish + ``wait``). Workers put a batch due within a few polls on their
   timer (worker/waker.py, waking.py), so the target is p95 <= 50 ms, with the poll
   (0.2 s here) as the safety net that needs no margin.

    python -m benchmarks.batches [--calls 2000] [--lone 20]
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import _fleet
from tests.support.projects.collapse import CollapseHarness

WAIT = 0.5
LATENESS_TARGET = 0.05  # the waker's timer claims a batch LEAD before it is due: no poll in it


def _rate(h: Any, name: str, calls: int) -> float:
    task = h.app.tasks[name]
    t0 = time.perf_counter()
    results = [task.delay(i) for i in range(calls)]
    values = [r.get(timeout=300) for r in results]
    elapsed = time.perf_counter() - t0
    assert values == [2 * i for i in range(calls)], f"{name}: wrong results"
    return calls / elapsed


def _lateness(h: Any, lone: int) -> list[float]:
    task = h.app.tasks["proj.lone"]
    late = []
    for _ in range(lone):
        before = len(h.listed("lone"))
        at = time.time()
        task.delay(0).get(timeout=30)
        started = float(h.listed("lone")[before])
        late.append(started - (at + WAIT))
    return late


def main(argv: list[str] | None = None) -> int:
    p = _fleet.parser(__doc__)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--lone", type=int, default=20)
    args = p.parse_args(argv)
    calls = 500 if args.quick else args.calls
    with _fleet.fleet(kind=CollapseHarness) as h:
        h.result_backend = _fleet.REDIS_URL
        h.start_worker(concurrency=2)
        _rate(h, "proj.double", 20)  # warm both paths
        _rate(h, "proj.doubles", 20)
        one = _rate(h, "proj.double", calls)
        batched = _rate(h, "proj.doubles", calls)
        late = _lateness(h, 5 if args.quick else args.lone)
        theirs = None
        if "proj.cb_doubles" in h.app.tasks:
            h.stop_all()
            # celery-batches buffers in the worker: it needs a prefetch of a batch or more.
            h.start_worker(concurrency=2, extra=["--prefetch-multiplier", "100"])
            _rate(h, "proj.cb_doubles", 20)
            theirs = _rate(h, "proj.cb_doubles", calls)
    p95 = _fleet.percentile(late, 95)
    rows = [
        _fleet.Row("calls/s, flow_batch size 100 vs one by one", batched, one, "c/s",
                   batched / one, "> 1", batched > one),
    ]
    if theirs is not None:
        rows.append(_fleet.Row("calls/s, flow_batch vs celery-batches (size 100)", batched, theirs,
                               "c/s", batched / theirs, "report", True))
    rows.append(_fleet.Row(f"batch formation lateness p50 (wait {WAIT} s)",
                           _fleet.percentile(late, 50) * 1000, None, "ms", None, "report", True))
    rows.append(_fleet.Row(f"batch formation lateness p95 (wait {WAIT} s)", p95 * 1000, None,
                           "ms", None, f"<= {LATENESS_TARGET * 1000:.0f} ms",
                           p95 <= LATENESS_TARGET))
    print(_fleet.table("flow_batch", rows))
    if theirs is None:
        print("celery-batches: not installed (pip install -e '.[bench-baselines]') - no baseline run")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
