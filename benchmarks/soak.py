"""Soak: a steady mixed load on 3 prefork nodes for a long time, and what it leaves behind.

Four flow queues at once: ``conc`` (4 slots, fairness by key over 3 tenants, 2 per key,
priorities 0-3), ``fixed`` (fixed window), ``slide`` (sliding window), ``gcra`` (GCRA with a
burst). A producer sends to each in 5 s phases at 1.3x and 0.5x of its capacity (0.9x on
average), so queues fill, park and drain again all run long; then the fleet drains. Judged:

* no lost task: every label finishes (duplicates, Celery's at-least-once, are counted); the
  drain goes on past its time while tasks still finish, and a label still parked or still in
  the broker queue at the end is counted apart (late, not lost: it still fails the target);
* no cap exceeded: ``conc`` in flight <= 4 and <= 2 per key (task-measured); in any 1 s span
  of admission instants (Redis TIME), ``slide`` <= its limit, ``gcra`` <= limit + burst,
  ``fixed`` <= 2 x its limit (a fixed window allows a burst across its boundary);
* no slot leaked: every queue back to 0 busy and 0 granted at the end;
* worker RSS flat: each node's main + pool RSS at the end within 10% of its level after warm-up.

Profiles (:data:`PROFILES`): full (default, 600 s, limits 30/25/22 per s and 0.15 s conc
tasks: ~93 tasks/s, ~56,000 tasks) and ``--quick`` (120 s, limits 10/8/7 and 0.5 s conc tasks:
~30 tasks/s, ~3,600 tasks; CI runs it through tests/chaos/test_soak.py).
``python -m benchmarks.soak [--quick]`` from the repository root. ``main`` returns True when
every target is met; the figures are in :data:`ROWS` and the time series in :data:`SERIES`
(benchmarks/report.py draws them).
"""

from __future__ import annotations

import random
import statistics
import sys
import threading
import time
from typing import Any

from benchmarks._fleet import Row, children, parser, rss_kb, table
from tests.support.harness import max_in_window, max_overlap
from tests.support.projects.chaos import ChaosHarness

#: Per profile: each rate queue's limit per second, and conc's task length (4 slots).
PROFILES = {
    "full": {"fixed": 30, "slide": 25, "gcra": 22, "burst": 5, "conc_seconds": 0.15, "seconds": 600.0,
             "drain": 180.0},
    "quick": {"fixed": 10, "slide": 8, "gcra": 7, "burst": 3, "conc_seconds": 0.5, "seconds": 120.0,
              "drain": 60.0},
}
CONC_SLOTS = 4
#: The producer alternates 5 s at 1.3x and 5 s at 0.5x of each queue's capacity (0.9x on
#: average): queues fill, park and drain again all run long.
PHASES = (1.3, 0.5)
ROWS: list[Row] = []
SERIES: dict[str, Any] = {}


def queues(p: dict[str, Any]) -> list[dict[str, Any]]:
    """The four flow queues of a profile."""
    return [
        {"name": "conc", "concurrency": CONC_SLOTS, "fairness": "key", "per_key_concurrency": 2, "retry": 0.5},
        {"name": "fixed", "rate_limit": f"{p['fixed']}/s"},
        {"name": "slide", "rate_limit": {"limit": p["slide"], "period": 1, "algorithm": "sliding"}},
        {"name": "gcra", "rate_limit": {"limit": p["gcra"], "period": 1, "algorithm": "gcra", "burst": p["burst"]}},
    ]


def capacity(p: dict[str, Any]) -> dict[str, float]:
    """Tasks/s each queue can take."""
    return {"conc": CONC_SLOTS / p["conc_seconds"], "fixed": p["fixed"], "slide": p["slide"], "gcra": p["gcra"]}


def produce(h: ChaosHarness, p: dict[str, Any], sent: dict[str, list[str]]) -> None:
    """Send in phases (:data:`PHASES`) for the profile's duration; labels go into ``sent``."""
    task = h.app.tasks["proj.cwork"]
    rng = random.Random(7)
    rates = capacity(p)
    owed = dict.fromkeys(rates, 0.0)
    start = time.monotonic()
    n = 0
    while (now := time.monotonic()) < start + p["seconds"]:
        factor = PHASES[int((now - start) // 5) % len(PHASES)]
        for q, rate in rates.items():
            owed[q] += rate * factor * 0.1
            while owed[q] >= 1:
                owed[q] -= 1
                n += 1
                label = f"{q}.{n}"
                if q == "conc":
                    options = {"fairness_key": f"tenant-{n % 3}", "flow_priority": rng.randrange(4)}
                    args: tuple[Any, ...] = (label, p["conc_seconds"])
                else:
                    options, args = {}, (label, 0.0)
                h.ids[label] = str(task.apply_async(args, flow_queue=q, **options).id)
                sent[q].append(label)
        time.sleep(max(0.0, 0.1 - (time.monotonic() - now)))


def node_rss(h: ChaosHarness) -> dict[str, int]:
    """KiB of RSS per worker node: its main process plus its pool."""
    out = {}
    for node in h.nodes:
        if node.kind == "worker" and node.alive():
            pid = node.proc.pid
            out[node.name] = rss_kb(pid) + sum(rss_kb(c) for c in children(pid))
    return out


def run(p: dict[str, Any]) -> bool:
    """One soak; fills ROWS and SERIES; True when every target is met."""
    import shutil
    import tempfile
    import uuid
    from pathlib import Path

    from benchmarks._fleet import REDIS_URL

    workdir = Path(tempfile.mkdtemp(prefix="fc-soak-"))
    prefix = f"fcs-{uuid.uuid4().hex[:8]}"
    conf = {"flowcontrol_backend_url": REDIS_URL, "flowcontrol_queues": queues(p),
            "flowcontrol_parking_url": f"sqlite:///{workdir / 'park.sqlite3'}",
            "flowcontrol_poll_interval": 0.2,
            # A grant whose waiter never comes back (see docs/guarantees.md) passes on after
            # this, instead of the default 120 s; the drain then tells lost from merely late.
            "flowcontrol_grant_ttl": 10.0}
    h = ChaosHarness(workdir=workdir / "proj", broker_url=REDIS_URL, gauge_url=REDIS_URL, prefix=prefix,
                     conf=conf)
    sent: dict[str, list[str]] = {q: [] for q in capacity(p)}
    rss: list[tuple[float, dict[str, int]]] = []
    try:
        # The three nodes start side by side: the load begins once all are ready.
        for node in [h.start_worker(3, name=f"n{i + 1}", wait=False) for i in range(3)]:
            h.wait_ready(node)
        began = time.time()
        producer = threading.Thread(target=produce, args=(h, p, sent), daemon=True)
        producer.start()
        while producer.is_alive():
            rss.append((time.time() - began, node_rss(h)))
            producer.join(5.0)
        labels = [x for q in sent.values() for x in q]
        drain(h, labels, p["drain"])
        time.sleep(2.0)  # the last releases land
        rss.append((time.time() - began, node_rss(h)))
        return judge(h, p, sent, rss, began)
    except BaseException:
        print(h.logs(2000))
        raise
    finally:
        h.close()
        shutil.rmtree(workdir, ignore_errors=True)


def drain(h: ChaosHarness, labels: list[str], seconds: float) -> None:
    """Wait for every label: at least *seconds*, and on while tasks still finish (a fleet that
    fell behind its producer on a busy machine is late, not lossy), up to twice *seconds*."""
    start = time.monotonic()
    left, moved = len(labels), start
    while True:
        now = time.monotonic()
        remaining = len(set(labels) - set(h.gauge.done()))
        if remaining < left:
            left, moved = remaining, now
        if not remaining or now - start >= 2 * seconds or (now - start >= seconds and now - moved >= 15):
            break
        time.sleep(1.0)
    print(f"soak: drained for {time.monotonic() - start:.0f} s, {left} of {len(labels)} unfinished")


def in_broker(h: ChaosHarness) -> set[bytes]:
    """Every message body still ready or delivered-but-unacked in the harness's broker queue."""
    import redis

    client = redis.Redis.from_url(h.broker_url)
    try:
        names = [h.queue_name, *(f"{h.queue_name}\x06\x16{n}" for n in range(1, 10))]
        raws = [raw for name in names for raw in client.lrange(f"{h.prefix}:{name}", 0, -1)]
        return {*raws, *client.hvals(f"{h.prefix}:unacked")}
    finally:
        client.close()


def judge(h: ChaosHarness, p: dict[str, Any], sent: dict[str, list[str]],
          rss: list[tuple[float, dict[str, int]]], began: float) -> bool:
    """Count, compare with the targets, fill ROWS and SERIES."""
    from celery_flowcontrol import FlowControl

    seconds = p["seconds"]
    bounds = {"fixed": 2 * p["fixed"], "slide": p["slide"], "gcra": p["gcra"] + p["burst"]}
    labels = [x for q in sent.values() for x in q]
    done, runs = h.gauge.done(), h.gauge.runs()
    missing_labels = set(labels) - set(done)
    missing = len(missing_labels)
    still_parked = sum(1 for x in missing_labels if h.store().get(h.ids.get(x, "")) is not None)
    queued = in_broker(h) if missing_labels else set()
    still_queued = sum(1 for x in missing_labels if any(h.ids.get(x, "?").encode() in raw for raw in queued))
    extra = sum(n - 1 for n in runs.values() if n > 1)
    execs = h.gauge.executions()
    conc = [r for r in execs if r.label.startswith("conc.")]
    peak = max_overlap(conc)
    tenant = {label: int(label.split(".")[1]) % 3 for label in sent["conc"]}  # see produce()
    key_peak = max(max_overlap([r for r in conc if tenant.get(r.label) == k]) for k in range(3))
    admitted: dict[str, list[float]] = {q: [] for q in sent}
    for raw in h.gauge.client.lrange(h.gauge.key("admitted"), 0, -1):
        label, at = raw.decode().rsplit("|", 1)
        admitted[label.split(".")[0]].append(float(at))
    exact = all(admitted[q] for q in ("fixed", "slide", "gcra"))
    times = {q: admitted[q] if exact else [r.start for r in execs if r.label.startswith(q + ".")]
             for q in sent}
    windows = {q: max_in_window(times[q], 1.0)[0] for q in ("fixed", "slide", "gcra")}
    backend = FlowControl(h.app).backend
    leaked = {q: (backend.stats(q).in_use, backend.stats(q).granted) for q in sent}
    slack = 0 if exact else 1
    warm = [s for t, s in rss if t >= seconds * 0.25] or [s for _, s in rss]
    growth = 0.0
    for node in warm[0]:
        series = [s.get(node, 0) for s in warm if s.get(node)]
        first, last = statistics.median(series[:3]), statistics.median(series[-3:])
        growth = max(growth, (last - first) / first * 100 if first else 0.0)
    ROWS[:] = [
        Row(f"tasks completed of {len(labels)}", len(labels) - missing, len(labels), "", None, "all", missing == 0),
        Row("missing tasks still parked (late, not lost)", still_parked, None, "", None, "counted", True),
        Row("missing tasks still queued (late, not lost)", still_queued, None, "", None, "counted", True),
        Row("extra runs (at-least-once duplicates)", extra, None, "", None, "counted", True),
        Row("conc: peak in flight (task-measured)", peak, CONC_SLOTS, "", peak / CONC_SLOTS, f"<= {CONC_SLOTS}",
            peak <= CONC_SLOTS),
        Row("conc: peak in flight of one fairness key", key_peak, 2, "", key_peak / 2, "<= 2", key_peak <= 2),
        *[Row(f"{q}: most {'admissions' if exact else 'starts'} in any 1 s", windows[q], bounds[q], "",
              windows[q] / bounds[q], f"<= {bounds[q]}{'+1' if slack else ''}", windows[q] <= bounds[q] + slack)
          for q in ("fixed", "slide", "gcra")],
        Row("slots busy or granted at the end", sum(a + b for a, b in leaked.values()), 0, "", None, "0",
            all(a == b == 0 for a, b in leaked.values())),
        Row("worst node RSS growth after warm-up", growth, None, "%", None, "<= 10 %", growth <= 10.0),
    ]
    SERIES.clear()
    SERIES.update(
        cap=CONC_SLOTS, began=began, seconds=seconds,
        conc_runs=[(r.start - began, (r.end or r.start) - began) for r in conc],
        slide_admitted=[t - began for t in times["slide"]], slide_limit=p["slide"],
        rss=[(t, {k: v / 1024 for k, v in s.items()}) for t, s in rss],
    )
    print(table(f"soak: {seconds:.0f} s of load, {len(labels)} tasks on 3 nodes, "
                f"leaked per queue (busy, granted): {leaked}", ROWS))
    return all(r.ok for r in ROWS)


def main(quick: bool = False) -> bool:
    """``python -m benchmarks.soak [--quick]``; True when every target is met."""
    p = parser(__doc__.splitlines()[0] if __doc__ else None)
    args = p.parse_args([] if quick else sys.argv[1:])
    quick = quick or args.quick
    return run(PROFILES["quick" if quick else "full"])


if __name__ == "__main__":
    raise SystemExit(0 if main() else 1)
