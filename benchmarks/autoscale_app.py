"""The Celery app that ``benchmarks/autoscale.py`` starts workers on; configured by environment.

``BENCH_BROKER``  broker URL (a dedicated Redis DB)       ``BENCH_QUEUE``  the queue of this arm
``BENCH_SCALER``  ``adaptive`` or ``stock``               ``BENCH_RAM``    ``1``: inject the S2 RAM gauge
``BENCH_TICK``    the adaptive tick in seconds     ``BENCH_RAM_LEAK_AT``  epoch of S2's leak

Each task makes one HTTP request to the knee server and raises on a 503 or a timeout, so the
worker sees the downstream's errors as task failures (drops).
"""

from __future__ import annotations

import os
import time
import urllib.request

from celery import Celery
from celery.worker import state

import celery_flowcontrol.worker.control  # noqa: F401  (flowcontrol_stats in this process too)

app = Celery("autoscale_bench", broker=os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/13"))
app.conf.update(
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
if os.environ.get("BENCH_SCALER") == "adaptive":
    app.conf.worker_autoscaler = "celery_flowcontrol.autoscale:AdaptiveAutoscaler"
    app.conf.flowcontrol_autoscale = {"tick": float(os.environ.get("BENCH_TICK", "1.0"))}
    if os.environ.get("BENCH_RAM") == "1":
        app.conf.flowcontrol_autoscale["ram_gauge"] = "autoscale_app:injected_ram"


LEAK_AT = float(os.environ.get("BENCH_RAM_LEAK_AT", "inf"))


def ram_formula(now: float, inflight: int, leak_at: float = LEAK_AT) -> float:
    """50% + 5 points per task in flight (85% at 7), plus a leak of 1 point/s for 10 s from ``leak_at``."""
    return 50.0 + min(max(now - leak_at, 0.0), 10.0) + 5.0 * inflight


def injected_ram() -> float:
    """S2's RAM gauge, read by the autoscaler in the worker's main process."""
    return ram_formula(time.time(), len(state.active_requests))


@app.task(name="bench.hit")
def hit(url: str, timeout: float = 1.0) -> None:
    """One request to the knee server; a 503 or a timeout raises (urllib's errors are OSErrors)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        response.read()
