"""Calls that collapse: what ``flow_unique`` adds to a publish, and how far a burst collapses.

1. Publish cost: ``delay()`` of a plain FlowTask vs the same task with ``flow_unique=True``
   (each call distinct arguments, so each claims a new key: the unique path's full cost), and
   a duplicate call (a held key: one claim, nothing sent), on a real Redis broker and Redis
   admission backend. Rounds alternate (plain, unique, plain, unique, ...) so a noisy
   neighbour on a shared machine hits both alike; the ratio is of the medians, same run.
2. Debounce: a burst of ``--burst`` calls (default 10,000) of a ``flow_debounce`` task, then
   the due row woken by the waker's own ``wake_due``: how many messages reach the broker (the
   collapse ratio is calls per message) and what one call inside a burst costs.

    python -m benchmarks.collapse [--calls 500] [--burst 10000] [--redis-url URL]

Targets: a unique call's publish costs at most :data:`UNIQUE_TARGET` x a plain one; a burst
sends exactly one message. Figures go through ``_fleet.table``, so ``python -m benchmarks``
puts them into REPORT.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from benchmarks import _fleet
from celery_flowcontrol import FlowControl, FlowTask
from celery_flowcontrol.collapse.wiring import debounce_rows_of
from celery_flowcontrol.worker.republish import wake_due

ROUNDS = 6
#: A unique call's publish against a plain call's: one Redis round trip (the Lua claim) is
#: added to a publish that is itself a few round trips (figures: REPORT.md).
UNIQUE_TARGET = 2.0


def make_app(redis_url: str, prefix: str, parking_url: str) -> Celery:
    app = Celery("bench", broker=redis_url, set_as_current=False)
    app.conf.update(task_default_queue=f"{prefix}.q", flowcontrol_backend_url=redis_url,
                    flowcontrol_key_prefix=prefix, flowcontrol_parking_url=parking_url,
                    broker_transport_options={"global_keyprefix": f"{prefix}:"})
    FlowControl(app)

    @app.task(name="bench.plain", base=FlowTask, shared=False)
    def plain(n: int) -> int:
        return n

    @app.task(name="bench.unique", base=FlowTask, shared=False, flow_unique=True)
    def unique(n: int) -> int:
        return n

    @app.task(name="bench.debounced", base=FlowTask, shared=False, flow_debounce="1h")
    def debounced(n: int) -> int:
        return n

    return app


def rate(call: Any, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        call(i)
    return n / (time.perf_counter() - start)


def cleanup(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i:i + 500])
    client.close()


def main(argv: list[str] | None = None) -> bool:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per round and kind")
    parser.add_argument("--burst", type=int, default=10_000, help="calls in the debounced burst")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    prefix = f"fcb-{uuid.uuid4().hex[:8]}"
    here = Path(tempfile.mkdtemp(prefix="flowcontrol-bench-"))
    app = make_app(args.redis_url, prefix, f"sqlite:///{here / 'parking.sqlite3'}")
    plain, unique, debounced = (app.tasks[f"bench.{n}"] for n in ("plain", "unique", "debounced"))
    try:
        plain.delay(-1), unique.delay(-1)  # connections, scripts, pools: warm before timing
        rates: dict[str, list[float]] = {"plain": [], "unique": [], "duplicate": []}
        for r in range(ROUNDS):
            base = (r + 1) * 1_000_000
            rates["plain"].append(rate(lambda i, b=base: plain.delay(b + i), args.calls))
            rates["unique"].append(rate(lambda i, b=base: unique.delay(b + i), args.calls))
            # The same arguments again: every key is held, every call a duplicate.
            rates["duplicate"].append(rate(lambda i, b=base: unique.delay(b + i), args.calls))
        med = {k: statistics.median(v) for k, v in rates.items()}
        cost = med["plain"] / med["unique"]

        client = redis.Redis.from_url(args.redis_url)
        queue = f"{prefix}:{prefix}.q"
        before = client.llen(queue)
        start = time.perf_counter()
        ids = {debounced.delay(i).id for i in range(args.burst)}
        elapsed = time.perf_counter() - start
        rows = debounce_rows_of(app).pending()
        store = debounce_rows_of(app).store
        for row in rows:
            store.reschedule(row.task_id, time.time() - 1)  # due now, not in an hour
        woken = wake_due(app, store)
        sent = client.llen(queue) - before
        client.close()
        figures = [
            _fleet.Row(f"unique publish, {args.calls} x {ROUNDS} calls", med["unique"],
                       med["plain"], "calls/s", cost, f"<= {UNIQUE_TARGET} x plain cost",
                       cost <= UNIQUE_TARGET),
            _fleet.Row("duplicate call (held key, nothing sent)", med["duplicate"],
                       med["plain"], "calls/s", med["plain"] / med["duplicate"], "-", True),
            _fleet.Row(f"debounce: messages sent for {args.burst} calls", float(sent), 1.0,
                       "msgs", float(sent), "1 message", sent == 1 and woken == 1 and len(ids) == 1),
            _fleet.Row("debounce: collapse ratio (calls per message)",
                       args.burst / max(sent, 1), float(args.burst), ":1", None, "-", True),
            _fleet.Row("debounce: calls/s inside the burst (SQLite)", args.burst / elapsed,
                       med["plain"], "calls/s", med["plain"] / (args.burst / elapsed), "-", True),
        ]
        print(_fleet.table("collapse: Redis broker and backend, SQLite parking (ratio: x plain "
                           "publish cost)", figures))
        return all(f.ok for f in figures)
    finally:
        app.close()
        cleanup(args.redis_url, prefix)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
