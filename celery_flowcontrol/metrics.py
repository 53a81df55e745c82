"""Prometheus metrics of flow queues and workers, for the dashboard's ``/metrics`` and a worker's
own exporter.

Gauges are read live from the admission backend and the parking store at every scrape:
``flowcontrol_in_use``, ``_capacity``, ``_granted``, ``_waiting``, ``_parked``, ``_rate_used``,
per ``queue``; ``flowcontrol_rate_limit_used`` and, for an adaptive limit, ``_rate_limit_live``
per ``queue`` and ``limit`` (each of a queue's rate limits); ``flowcontrol_backoff_until`` (the
epoch second a backoff in force ends) per ``queue``; ``flowcontrol_dead_letters`` per
``reason``; the tenant metrics of metrics_tenants.py. Counters and the wait-time
histogram come from a :class:`Sampler`, which compares successive snapshots of each queue,
because the backends keep no event counters:

* ``flowcontrol_admitted_total``: slot ids are ``"<queue>:<n>"`` with *n* counting every slot a
  queue ever handed out (admissions and grants), so the growth of the highest *n* seen in the busy
  slots and pending grants is the number of admissions. Exact over time; a burst that starts and
  ends between two samples is counted at the next sample that sees a later slot.
* ``flowcontrol_denied_total{reason}``: waiters carry an arrival number that grows by one per new
  waiter (a waiter that re-checks keeps its number), so its growth counts first denials. The
  reason is inferred at the sample: ``paused`` or ``backoff`` while one is in force, ``rate``
  when a rate limit is spent, ``concurrency`` when every slot is taken; else (slots are free:
  only a key's own limits can deny then) per new waiter: ``key-concurrency`` when its key holds
  its cap, else ``key-rate`` when the queue has per-key rate limits, else ``key-concurrency``.
* ``flowcontrol_wait_seconds``: a waiter seen at one sample that holds a slot or a grant at the
  next waited from its ``since`` to the grant (exact); one that vanished without a trace before its
  expiry was served between samples (its wait is measured to the sample, at most one interval late).
* ``flowcontrol_reclaimed_total{reason}``: what the sampler's own reclaim passes took back (the
  dashboard runs one per ``flowcontrol_reclaim_interval`` on a shared backend, as beat does).

``flowcontrol_batches_total{task}`` and the ``flowcontrol_batch_size{task}`` histogram count the
``flow_batch`` batches that finished and the calls each held, fleet-wide with the Redis
backend (collapse/batchstats.py).

Worker gauges (``flowcontrol_worker_*{worker}``) come from the ``flowcontrol_stats`` figures
(the autoscaler's live limit, in flight, RSS, CPU, throughput, p95).

Needs ``prometheus_client`` (the ``dashboard`` extra) only for :class:`FlowControlCollector`
and :func:`start_worker_exporter`; the :class:`Sampler` is plain Python.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import FlowControlError, MissingDependencyError, UnknownQueueError
from .metrics_tenants import tenant_families
from .reasons import Reason
from .views.clock import backend_now
from .views.denials import denial_reasons
from .views.queues import QueueRow, queue_rows
from .views.slot_rows import seq_of

__all__ = ["WAIT_BUCKETS", "QueueSample", "Sampler", "FlowControlCollector", "start_worker_exporter"]

#: Upper bounds (seconds) of the wait-time histogram's buckets.
WAIT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
#: The reasons a denial is counted under (reasons.py's strings).
REASONS = (Reason.RATE.value, Reason.CONCURRENCY.value, Reason.KEY_CONCURRENCY.value,
           Reason.BACKOFF.value, Reason.KEY_RATE.value, Reason.PAUSED.value)
RECLAIM_REASONS = ("instances", "max_hold", "grants", "waiters")
#: A jump of the slot sequence this large between two samples is no burst of admissions but
#: a queue re-created by ``AdmissionBackend.restore``, numbered from the clock
#: (``admission.base.sequence_floor``).
RENUMBERED = 10**9


def import_prometheus() -> Any:
    """``prometheus_client``, or :class:`MissingDependencyError` naming the extra."""
    try:
        import prometheus_client
    except ImportError as exc:
        raise MissingDependencyError("dashboard", "prometheus_client") from exc
    return prometheus_client


@dataclass
class QueueSample:
    """One queue at one sampling instant, with what happened since the previous sample."""

    t: float
    row: QueueRow
    admitted: int = 0
    denied: dict[str, int] = field(default_factory=dict)
    waits: list[float] = field(default_factory=list)


@dataclass
class _Track:
    """What the sampler remembers of one queue between samples."""

    sampled: bool = False  # False until the baseline pass
    slot_hw: int | None = None
    waiter_hw: int | None = None
    waiters: dict[str, tuple[float, float]] = field(default_factory=dict)  # task -> (since, expires)
    admitted_total: int = 0
    denied_total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    buckets: list[int] = field(default_factory=lambda: [0] * (len(WAIT_BUCKETS) + 1))
    wait_sum: float = 0.0

    def observe(self, wait: float) -> None:
        for i, bound in enumerate(WAIT_BUCKETS):
            if wait <= bound:
                self.buckets[i] += 1
                break
        else:
            self.buckets[-1] += 1
        self.wait_sum += wait


class Sampler:
    """Derives counters and wait times of every queue from successive backend snapshots.

    Call :meth:`sample` periodically (the dashboard does every 2 s); thread-safe. *waiter_limit*
    bounds the waiters read per queue and sample; *reclaim_every* (seconds, ``None``: never)
    makes :meth:`sample` run an eager reclaim pass that often and count what it took back.
    """

    def __init__(self, fc: Any, *, waiter_limit: int = 500, reclaim_every: float | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.fc = fc
        self.waiter_limit = waiter_limit
        self.reclaim_every = reclaim_every
        # The backend's clock by default: waits are differences of its own timestamps.
        self.clock = clock or (lambda: backend_now(fc))
        self.reclaimed_total = dict.fromkeys(RECLAIM_REASONS, 0)
        self._tracks: dict[str, _Track] = {}
        self._last_reclaim = 0.0
        self._lock = threading.Lock()

    def sample(self) -> dict[str, QueueSample]:
        """One pass over every queue: live figures plus what happened since the last pass."""
        with self._lock:
            now = self.clock()
            if self.reclaim_every is not None and now - self._last_reclaim >= self.reclaim_every:
                self._last_reclaim = now
                report = self.fc.backend.reclaim()
                for reason in RECLAIM_REASONS:
                    self.reclaimed_total[reason] += getattr(report, reason)
            out = {}
            rows = queue_rows(self.fc)
            for row in rows:
                try:
                    out[row.name] = self._sample_queue(row, now)
                except UnknownQueueError:
                    continue
            for gone in set(self._tracks) - {r.name for r in rows}:
                del self._tracks[gone]
            return out

    def _sample_queue(self, row: QueueRow, now: float) -> QueueSample:
        backend = self.fc.backend
        track = self._tracks.setdefault(row.name, _Track())
        sample = QueueSample(now, row)
        slots = backend.busy_slots(row.name)
        grants = backend.pending_grants(row.name)
        waiters = backend.waiters(row.name, self.waiter_limit)
        # admissions: growth of the slot sequence. A lower highest number than before is no reset:
        # the newest slots were simply released while an older one is still busy.
        # Until a first number is known (the queue was idle at the baseline), count new ids.
        numbers = [seq_of(s.slot_id) for s in slots] + [seq_of(g.slot_id) for g in grants]
        hw = max(numbers, default=None)
        if hw is not None:
            if track.slot_hw is not None and hw - track.slot_hw > RENUMBERED:
                # Re-created by restore after a loss: numbered from the clock now, not a burst.
                sample.admitted = len(numbers)
            elif track.slot_hw is not None:
                sample.admitted = max(0, hw - track.slot_hw)
            elif track.sampled:
                sample.admitted = len(numbers)
            track.slot_hw = hw if track.slot_hw is None else max(hw, track.slot_hw)
        # first denials: growth of the waiters' arrival numbers
        whw = max((w.seq for w in waiters), default=None)
        if whw is not None:
            new = 0
            if track.waiter_hw is not None:
                new = max(0, whw - track.waiter_hw)
            elif track.sampled:
                new = sum(1 for w in waiters if w.task_id not in track.waiters)
            if new:
                fresh = [w for w in waiters
                         if (w.seq > track.waiter_hw if track.waiter_hw is not None
                             else w.task_id not in track.waiters)]
                sample.denied = denial_reasons(row, self.fc.config_of(row.name), slots, fresh, new)
            track.waiter_hw = whw if track.waiter_hw is None else max(whw, track.waiter_hw)
        # waits that ended: waiters seen last time that are gone from the line now
        served = {g.task_id: g.granted_at for g in grants}
        served.update({s.task_id: s.acquired_at for s in slots if s.task_id not in served})
        line = {w.task_id: (w.since, w.expires_at) for w in waiters}
        for task_id, (since, expires) in track.waiters.items():
            if task_id in line:
                continue
            if task_id in served:
                sample.waits.append(max(0.0, served[task_id] - since))
            elif now < expires:
                sample.waits.append(max(0.0, now - since))
        track.waiters = line
        track.sampled = True
        track.admitted_total += sample.admitted
        for reason, n in sample.denied.items():
            track.denied_total[reason] += n
        for wait in sample.waits:
            track.observe(wait)
        return sample

    def totals(self) -> dict[str, dict[str, Any]]:
        """Per queue: ``admitted``, ``denied`` by reason, wait ``buckets`` (cumulative) and ``sum``."""
        with self._lock:
            out = {}
            for name, t in self._tracks.items():
                cumulative, running = [], 0
                for n in t.buckets:
                    running += n
                    cumulative.append(running)
                out[name] = {"admitted": t.admitted_total, "denied": dict(t.denied_total),
                             "buckets": cumulative, "sum": t.wait_sum}
            return out


# -- Prometheus ------------------------------------------------------------------------------------

_GAUGES = (
    ("in_use", "Slots busy now."),
    ("capacity", "Slots the queue may have busy at once (override or config; absent: unlimited)."),
    ("granted", "Freed slots reserved for a waiter that has not come back yet."),
    ("waiting", "Waiters (denied tasks in line)."),
    ("parked", "Messages parked in the SQL table."),
    ("rate_used", "Admissions counted in the current rate window."),
)
_WORKER_GAUGES = (
    ("limit", "limit", "The autoscaler's live pool limit."),
    ("inflight", "inflight", "Tasks running now."),
    ("processes", "processes", "Pool processes now."),
    ("rss_bytes", "rss_bytes", "Resident memory of the worker and its pool."),
    ("cpu_percent", "cpu_pct", "CPU use of the worker and its pool."),
    ("throughput", "throughput", "Tasks finished per second."),
    ("p95_seconds", "p95_ms", "95th percentile task run time."),
)


class FlowControlCollector:
    """A ``prometheus_client`` collector of every queue (and worker) of one installation.

    *sampler*: where counters and the wait histogram come from (``None``: gauges only).
    *sample_on_collect*: take a sample at each scrape (a worker's exporter, where nothing else
    samples). *workers*: a callable returning ``{node: flowcontrol_stats figures}``.
    """

    def __init__(self, fc: Any, sampler: Sampler | None = None, *, sample_on_collect: bool = False,
                 workers: Callable[[], dict[str, dict[str, Any]]] | None = None) -> None:
        self.fc = fc
        self.sampler = sampler
        self.sample_on_collect = sample_on_collect
        self.workers = workers

    def describe(self) -> list[Any]:
        """Nothing up front: families are read at scrape time (registration must not scrape)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The metric families of this scrape."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        if self.sampler is not None and self.sample_on_collect:
            self.sampler.sample()
        rows = queue_rows(self.fc)
        for attr, doc in _GAUGES:
            g = GaugeMetricFamily(f"flowcontrol_{attr}", doc, labels=["queue"])
            for r in rows:
                value = getattr(r, attr)
                if value is not None:
                    g.add_metric([r.name], float(value))
            yield g
        yield from self._rate_families(GaugeMetricFamily, rows)
        yield from tenant_families(self.fc, rows, GaugeMetricFamily, CounterMetricFamily)
        yield self._dead_letters(GaugeMetricFamily)
        if self.sampler is not None:
            totals = self.sampler.totals()
            admitted = CounterMetricFamily("flowcontrol_admitted", "Slots handed out (admissions and grants).",
                                           labels=["queue"])
            denied = CounterMetricFamily("flowcontrol_denied", "Tasks denied and parked (first denial).",
                                         labels=["queue", "reason"])
            waits = HistogramMetricFamily("flowcontrol_wait_seconds", "Time from first denial to a slot.",
                                          labels=["queue"])
            for name, t in sorted(totals.items()):
                admitted.add_metric([name], t["admitted"])
                for reason in REASONS:
                    denied.add_metric([name, reason], t["denied"][reason])
                bounds = [*(f"{b:g}" for b in WAIT_BUCKETS), "+Inf"]
                waits.add_metric([name], list(zip(bounds, t["buckets"], strict=True)), t["sum"])
            reclaimed = CounterMetricFamily("flowcontrol_reclaimed", "Lapsed state taken back by reclaim passes.",
                                            labels=["reason"])
            for reason, n in self.sampler.reclaimed_total.items():
                reclaimed.add_metric([reason], n)
            yield from (admitted, denied, waits, reclaimed)
        yield from self._batch_families(CounterMetricFamily, HistogramMetricFamily)
        if self.workers is not None:
            yield from self._worker_families(GaugeMetricFamily)

    def _batch_families(self, counter: Any, histogram: Any) -> Iterator[Any]:
        """``flow_batch`` batches run per task, and their sizes (collapse/batchstats.py)."""
        from .collapse.batchstats import SIZE_BUCKETS
        from .collapse.wiring import batch_stats_of

        batches = counter("flowcontrol_batches", "flow_batch batches run (each a task run "
                          "for several calls).", labels=["task"])
        sizes = histogram("flowcontrol_batch_size", "Calls in each flow_batch batch run.",
                          labels=["task"])
        try:
            totals = batch_stats_of(self.fc.app).totals()
        except Exception:  # a scrape must not fail because Redis hiccupped
            totals = {}
        bounds = [*(str(b) for b in SIZE_BUCKETS[:-1]), "+Inf"]
        for task, t in sorted(totals.items()):
            batches.add_metric([task], t.count)
            sizes.add_metric([task], list(zip(bounds, t.cumulative(), strict=True)), t.calls)
        yield from (batches, sizes)

    @staticmethod
    def _rate_families(family: Any, rows: list[QueueRow]) -> Iterator[Any]:
        """Each rate limit's use and live figure, and the backoffs in force."""
        used = family("flowcontrol_rate_limit_used", "Use of each rate limit of a queue (calls, "
                      "or cost for a per-cost limit), in its current window.",
                      labels=["queue", "limit"])
        live = family("flowcontrol_rate_limit_live", "The live figure of an adaptive rate limit "
                      "(its ceiling is in the limit label).", labels=["queue", "limit"])
        backoff = family("flowcontrol_backoff_until", "When a backoff in force ends (epoch "
                         "seconds).", labels=["queue"])
        for r in rows:
            for rate in r.rates:
                used.add_metric([r.name, rate.limit], float(rate.used))
                if rate.live is not None:
                    live.add_metric([r.name, rate.limit], float(rate.live))
            if r.backoff_until is not None:
                backoff.add_metric([r.name], r.backoff_until)
        yield from (used, live, backoff)

    def _dead_letters(self, family: Any) -> Any:
        """Messages kept in the dead-letter table, by reason (``celery flowcontrol dead``)."""
        g = family("flowcontrol_dead_letters", "Messages in the dead-letter table (could not be "
                   "parked, or a parked row could not be published again).", labels=["reason"])
        for reason, n in sorted(self.fc.store.dead_counts().items()):
            g.add_metric([reason], float(n))
        return g

    def _worker_families(self, family: Any) -> Iterator[Any]:
        try:
            replies = self.workers() if self.workers else {}
        except Exception:  # a scrape must not fail because a broker hiccupped
            replies = {}
        for name, key, doc in _WORKER_GAUGES:
            g = family(f"flowcontrol_worker_{name}", doc, labels=["worker"])
            for node, figures in sorted(replies.items()):
                value = (figures.get("autoscaler") or {}).get(key) if isinstance(figures, dict) else None
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    g.add_metric([node], value / 1000 if key == "p95_ms" else float(value))
            yield g


def start_worker_exporter(app: Any, port: int = 9808, addr: str = "127.0.0.1") -> None:
    """Serve this worker's ``/metrics`` on *addr*:*port* once it is ready.

    Call it in the app module. The exporter shows every queue of the installation (counters
    sampled at each scrape) and this worker's own ``flowcontrol_stats`` figures::

        from celery_flowcontrol.metrics import start_worker_exporter
        start_worker_exporter(app, port=9808)
    """
    prometheus = import_prometheus()
    from celery import signals

    def on_ready(sender: Any = None, **kwargs: Any) -> None:
        from types import SimpleNamespace

        if getattr(sender, "app", None) is not app:
            return  # another app's worker in this process

        from .flowcontrol import FlowControl
        from .worker import control

        fc = FlowControl(app)
        state = SimpleNamespace(consumer=sender, app=app)
        hostname = str(getattr(sender, "hostname", "worker"))

        def mine() -> dict[str, dict[str, Any]]:
            return {hostname: control.collect(state)}

        registry = prometheus.CollectorRegistry()
        registry.register(FlowControlCollector(fc, Sampler(fc), sample_on_collect=True, workers=mine))
        try:
            prometheus.start_http_server(port, addr=addr, registry=registry)
        except OSError as exc:
            raise FlowControlError(f"can't serve worker metrics on {addr}:{port}: {exc}") from exc

    signals.worker_ready.connect(on_ready, weak=False)
