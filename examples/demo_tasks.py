"""The demo's Celery app: no server anywhere.

Broker: kombu's ``filesystem://`` transport (messages are files in a folder, so separate
processes share it); admission: the in-process ``memory://`` backend (exact for one worker);
parking: a SQLite file. Every path lives under ``$FLOWCONTROL_DEMO_DIR``.

The task measures itself in a small SQLite table: one transaction on entry raises the
in-flight count and the recorded peak, one on exit lowers it and writes the run's start and
end times. ``BEGIN IMMEDIATE`` takes SQLite's write lock first, so two pool processes never
read the same count.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from celery import Celery

from celery_flowcontrol import FlowControl, FlowTask

HERE = Path(os.environ.get("FLOWCONTROL_DEMO_DIR", "/tmp/flowcontrol-demo"))
CONCURRENCY = 5
RATE = 40  # per second, sliding window
TASK_SECONDS = 0.1


app = Celery("demo", broker="filesystem://")
app.conf.update(
    broker_transport="celery_flowcontrol.testing.filesystem:AtomicFilesystemTransport",
    broker_transport_options={
        # One folder both ways: the producer (demo.py) and the consumer (the worker) are on one machine.
        "data_folder_in": str(HERE / "broker"),
        "data_folder_out": str(HERE / "broker"),
        "processed_folder": str(HERE / "processed"),
        "control_folder": str(HERE / "control"),
        # The transport polls its folder; kombu's default of 1 s would add up to a second
        # to every wake (a woken task is a new file the worker must notice).
        "polling_interval": 0.02,
    },
    task_ignore_result=True,
    # Exactness: no prefetched message escapes admission, and none is acked before it ran.
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_reject_on_worker_lost=True,
    flowcontrol_queues=[
        {
            "name": "demo",
            "concurrency": CONCURRENCY,
            "rate_limit": {"limit": RATE, "period": 1, "algorithm": "sliding"},
        }
    ],
    flowcontrol_backend_url="memory://",
    flowcontrol_parking_url=f"sqlite:///{HERE / 'parking.sqlite3'}",
    flowcontrol_poll_interval=0.1,
)
FlowControl(app)


def measure_db() -> sqlite3.Connection:
    """A connection to the measurements file (created with its tables on first use)."""
    conn = sqlite3.connect(HERE / "measure.sqlite3", timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS gauge (id INTEGER PRIMARY KEY, inflight INT, peak INT)")
    conn.execute("INSERT OR IGNORE INTO gauge VALUES (1, 0, 0)")
    conn.execute("CREATE TABLE IF NOT EXISTS runs (n INT, start REAL, end REAL, admitted REAL)")
    return conn


@app.task(base=FlowTask, flow_queue="demo", name="demo.work", bind=True)
def work(self: Any, n: int) -> None:
    """Pretend to call a rate-limited API for 100 ms, and record it (with the instant it was
    admitted: the rate limit governs those; start times add the pool's own jitter)."""
    admitted = self.request.flow_admitted_at
    conn = measure_db()
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE gauge SET inflight = inflight + 1, peak = max(peak, inflight + 1) WHERE id = 1")
        conn.execute("COMMIT")
        start = time.time()
        time.sleep(TASK_SECONDS)
        end = time.time()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE gauge SET inflight = inflight - 1 WHERE id = 1")
        conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?)", (n, start, end, admitted or start))
        conn.execute("COMMIT")
    finally:
        conn.close()
