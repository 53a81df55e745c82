"""Punctual wakes: a parked ETA task starts on time, and a rate-held backlog uses its window.

Both arms run real ``celery worker`` prefork nodes on the Redis broker and admission backend,
SQLite parking, and the default poll (``flowcontrol_poll_interval`` 1 s: the safety net, not
the wake path; the other worker benchmarks poll every 0.2 s).

ETA. 40 calls with countdowns of 1.0 to 1.9 s (evenly spread, sent at once) on one node of 4
processes: plain Celery (the worker holds each message in its timer until its ETA) against a
FlowTask through an uncontended flow queue (each call is parked until its ETA and woken by the
worker that parked it). Lateness = the body's start minus the ETA, one machine's clock.
Target: flow p95 <= max(0.15 s, plain p95 + 0.1 s).

Window. A backlog of 60 tasks sent at once through a sliding window of 10 per second, two
nodes of two processes: the first 10 start at once and 10 more each second after, so the last
starts 5.0 s after the first at best (the ideal span). Use = ideal span / measured span of
start times; target >= 0.95. The admissions' own span (Redis TIME) is printed beside it.

    python -m benchmarks punctual       # both arms, once
    python -m benchmarks.punctual       # the same
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from benchmarks._fleet import Row, fleet, percentile, table
from tests.support.harness import Harness

CALLS, FIRST, SPREAD = 40, 1.0, 0.9
LIMIT, PERIOD, BACKLOG = 10, 1.0, 60
IDEAL = (BACKLOG - 1) // LIMIT * PERIOD
POLL = {"flowcontrol_poll_interval": 1.0}


def lateness(h: Harness, flow: bool) -> list[float]:
    """Send the 40 countdown calls; each start's lateness behind its ETA, in seconds."""
    options = {"flow_queue": "eta"} if flow else {}
    h.send("work", "warm", **options)  # the first task of a node pays its imports
    h.wait_done(["warm"], timeout=30)
    etas: dict[str, float] = {}
    now = time.time()
    for i in range(CALLS):
        label, eta = f"e{i}", now + FIRST + SPREAD * i / (CALLS - 1)
        etas[label] = eta
        h.send("work", label, eta=datetime.fromtimestamp(eta, timezone.utc), **options)
    h.wait_done(list(etas), timeout=60)
    return [run.start - etas[run.label] for run in h.gauge.executions() if run.label in etas]


def window_span(h: Harness) -> tuple[float, float]:
    """Send the backlog through the window; the span of its starts and of its admissions."""
    labels = [f"w{i}" for i in range(BACKLOG)]
    for label in labels:
        h.send("work", label, flow_queue="win")
    h.wait_done(labels, timeout=90)
    starts = sorted(run.start for run in h.gauge.executions() if run.label in set(labels))
    admitted = sorted(float(v) for v in h.gauge.client.lrange(h.gauge.key("admitted"), 0, -1))
    return starts[-1] - starts[0], admitted[-1] - admitted[0]


def main(quick: bool = False) -> bool:
    """Run both arms; print the table; True when every target is met."""
    with fleet(POLL, flow=False) as h:
        h.start_worker(4)
        plain = lateness(h, flow=False)
    with fleet({"flowcontrol_queues": [{"name": "eta", "concurrency": 100}], **POLL}) as h:
        h.start_worker(4)
        flow = lateness(h, flow=True)
    rate = {"limit": LIMIT, "period": PERIOD, "algorithm": "sliding"}
    with fleet({"flowcontrol_queues": [{"name": "win", "rate_limit": rate}], **POLL}) as h:
        h.start_worker(2)
        h.start_worker(2)
        span, admitted_span = window_span(h)
    f50, f95, fmax = (percentile(flow, q) for q in (50, 95, 100))
    p50, p95, pmax = (percentile(plain, q) for q in (50, 95, 100))
    bound = max(0.15, p95 + 0.1)
    use = IDEAL / span
    rows = [
        Row("ETA lateness p50", f50 * 1000, p50 * 1000, "ms", None, "-", True),
        Row("ETA lateness p95", f95 * 1000, p95 * 1000, "ms", None,
            f"<= {bound * 1000:.0f} ms", f95 <= bound),
        Row("ETA lateness max", fmax * 1000, pmax * 1000, "ms", None, "-", True),
        Row("ETA p95 difference (flow - plain)", (f95 - p95) * 1000, None, "ms", None, "-", True),
        Row(f"window {LIMIT}/s: span of {BACKLOG} starts", span, IDEAL, "s", use,
            ">= 0.95 use", use >= 0.95),
        Row(f"window {LIMIT}/s: span of admissions", admitted_span, IDEAL, "s",
            IDEAL / admitted_span, "-", True),
    ]
    print(table(f"punctual wakes: {CALLS} countdowns of {FIRST:g}-{FIRST + SPREAD:g} s (baseline: "
                f"plain Celery); {BACKLOG} tasks through a sliding {LIMIT}/s window (baseline: "
                f"the ideal span; ratio: use)", rows))
    return all(r.ok for r in rows)


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
