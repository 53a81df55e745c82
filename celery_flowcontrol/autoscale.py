"""AdaptiveAutoscaler: Celery's autoscaler, driven by latency, errors, RAM and CPU.

Enable it with ``worker_autoscaler = "celery_flowcontrol.autoscale:AdaptiveAutoscaler"`` and
``celery worker --autoscale=MAX,MIN``; tune it with ``flowcontrol_autoscale`` (see
``docs/autoscale.md``). The policy lives in :mod:`celery_flowcontrol.autoscaling.controller`; this
class only feeds it and applies its answer.

Where the figures come from, and why there:

* **Latency and errors** are timed where tasks run: ``task_prerun``/``task_postrun`` fire inside
  the pool child under prefork (in the worker itself under gevent/eventlet). A child sends one
  fixed-size record per task to the main process through a pipe made before the pool forks
  (:class:`~celery_flowcontrol.autoscaling.recorder.PipeFeed`); that is the only path that gives
  every task's runtime without ``-E`` task events and without replacing the Request class.
  Failures that only the main process sees (a lost worker, a hard time limit, an expired
  revoke) come from ``task_failure``/``task_revoked`` there.
* **In flight and stalls**: ``celery.worker.state.active_requests`` in the main process.
* **Demand** (does the pool need another slot?): under prefork, the share of task messages that
  arrive with every slot taken (the worker prefetches a few beyond the pool, so under a backlog
  they wait in it). Not under gevent/eventlet: there the consumer blocks inside ``pool.spawn``
  until a slot frees, so it fetches the next message only right after a slot opened, and
  equal-length tasks that started together finish together: after each such batch the next
  arrivals find free slots. Under a full backlog only about 1 in ``limit`` arrivals "found every
  slot taken" (0.5 at 2 slots, against the 0.75 the controller wants), which would keep the pool
  at 2 or 3 slots. On green pools tasks run and are timed in this process, with nothing between
  them but the broker round trip, so the runtime-based busy figure is exact and the controller
  judges demand by it.
* **RAM/CPU**: :mod:`celery_flowcontrol.autoscaling.gauges` (cgroup v1/v2 and host), or a
  callable given as ``ram_gauge``/``cpu_gauge``.

Applying a limit: ``pool.grow``/``pool.shrink`` (billiard only ever removes idle children, so a
busy one is never killed), and the consumer's prefetch (QoS) is set to ``limit x multiplier`` on
every resize. With ``task_acks_late`` and prefetch multiplier 1 that caps tasks in flight at the
limit where they are admitted, even while a busy child still waits to be removed.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from celery import signals
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError
from celery.worker import state as worker_state
from celery.worker.autoscale import Autoscaler

from .autoscaling.controller import GradientController
from .autoscaling.gauges import CpuGauge, memory_percent, rss_bytes
from .autoscaling.options import AutoscaleOptions
from .autoscaling.recorder import PipeFeed, TickRecorder
from .compat import pool_size, resized, unaccepted_jobs
from .settings import get_settings
from .worker import control  # noqa: F401  registers the flowcontrol_stats remote command

__all__ = ["AdaptiveAutoscaler", "can_resize", "is_drop"]

logger = logging.getLogger(__name__)

# Infrastructure failures: the downstream or the worker, not the task's own business logic.
DROP_TYPES: tuple[type[BaseException], ...] = (
    OSError,  # ConnectionError, socket.timeout, urllib's HTTPError/URLError
    TimeoutError,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
    WorkerLostError,
)
EARLY_DROPS = 8  # drops that trigger a tick before the timer does
RAM_EVERY = 0.1  # seconds between RAM reads (each costs a /proc read) on the task-message path


def is_drop(exc: BaseException | None, extra: tuple[str, ...] = ()) -> bool:
    """True when ``exc`` should count as a drop: infrastructure errors, or a class named in ``extra``.

    ``extra`` holds class names or dotted paths (``"requests.HTTPError"``) matched along the MRO.
    """
    if exc is None:
        return False
    exc = getattr(exc, "exc", None) or exc  # celery.exceptions.Retry wraps the real error
    if isinstance(exc, DROP_TYPES):
        return True
    names = {n for c in type(exc).__mro__ for n in (c.__name__, f"{c.__module__}.{c.__qualname__}")}
    return any(name in names for name in extra)


def can_resize(pool: Any) -> bool:
    """True for pools that can grow and shrink: prefork, gevent, eventlet (not threads or solo)."""
    # Prefork binds grow/shrink only when the pool starts, after the autoscaler is built.
    return _forks(pool) or callable(getattr(type(pool), "grow", None))


def _forks(pool: Any) -> bool:
    from celery.concurrency.prefork import TaskPool as PreforkPool

    return isinstance(pool, PreforkPool)


def _shutting_down() -> bool:
    # After "worker: Warm shutdown" the consumer takes no more tasks, so the pool empties while a
    # backlog waits: the controller read busy 0 there and logged an idle cut ("idle: busy 0.0 at
    # most, of 3") that looked like a wrong busy figure. Celery sets these to an exit code (0 too).
    return any(
        flag is not None and flag is not False for flag in (worker_state.should_stop, worker_state.should_terminate)
    )


class AdaptiveAutoscaler(Autoscaler):
    """Pool autoscaler that follows :class:`GradientController`; see the module docstring."""

    def __init__(self, pool: Any, max_concurrency: int, min_concurrency: int = 0, worker: Any = None, **kw: Any):
        super().__init__(pool, max_concurrency, min_concurrency, worker=worker, **kw)
        app = worker.app if worker is not None else None
        raw = get_settings(app).autoscale if app is not None else None
        self.options = opts = AutoscaleOptions.from_value(raw, min_concurrency, max_concurrency)
        assert opts.min is not None and opts.max is not None
        self.min_concurrency, self.max_concurrency = opts.min, opts.max
        # The worker's hub calls maybe_scale every `keepalive` seconds: make that our tick.
        self.keepalive = opts.tick
        self.controller = GradientController(
            min_limit=opts.min,
            max_limit=opts.max,
            start=opts.start,
            tolerance=opts.tolerance,
            shrink_tolerance=opts.shrink_tolerance,
            baseline_window=opts.baseline_window,
            ram_ceiling_pct=opts.ram_ceiling_pct,
            cpu_ceiling_pct=opts.cpu_ceiling_pct,
        )
        self.recorder = TickRecorder()
        self._pid = os.getpid()
        # Only prefork runs tasks in other processes. Green pools run them here, and the pipe
        # would even hang them: eventlet's green os.read waits for a pipe to become readable.
        self.feed = PipeFeed() if _forks(pool) else None
        self.cpu = CpuGauge()
        self.enabled = can_resize(pool)
        # Green pools: arrivals say nothing about demand there (see the module docstring).
        self._count_arrivals = not getattr(pool, "is_green", False)
        self._starts: dict[str, float] = {}
        self._last_tick = time.monotonic()
        self._born = self._last_tick
        self._cpu_spent = 0.0
        self._resize_spent = 0.0
        self._ram: float | None = None
        self._ram_peak: float | None = None  # highest RAM read since the last tick
        self._ram_read_at = 0.0
        self._cpu_pct: float | None = None
        if not self.enabled:
            logger.warning(
                "AdaptiveAutoscaler: the %s pool can't resize (use prefork, gevent or eventlet); "
                "autoscaling stays off and the pool keeps its size.",
                type(pool).__module__.rsplit(".", 1)[-1],
            )
            return
        if app is not None and not app.conf.task_acks_late:
            logger.warning(
                "AdaptiveAutoscaler: task_acks_late is off, so a cut only holds once busy children go "
                "idle; set task_acks_late=True and worker_prefetch_multiplier=1 for an exact cap."
            )
        for signal, receiver in (
            (signals.task_prerun, self._on_prerun),
            (signals.task_postrun, self._on_postrun),
            (signals.task_failure, self._on_failure),
            (signals.task_revoked, self._on_revoked),
        ):
            signal.connect(receiver, weak=False, dispatch_uid=f"flowcontrol-autoscale-{id(self)}-{signal.name}")

    # -- measuring (prerun/postrun run in the pool child under prefork) ------------------------

    def _emit(self, latency: float, dropped: bool) -> None:
        if self.feed is None or os.getpid() == self._pid:
            self.recorder.record(latency, dropped)
        else:
            self.feed.send(latency, dropped)

    def _on_prerun(self, task_id: str | None = None, **_: Any) -> None:
        if task_id is not None:
            self._starts[task_id] = time.monotonic()

    def _on_postrun(self, task_id: str | None = None, state: str | None = None, retval: Any = None, **_: Any) -> None:
        started = self._starts.pop(task_id, None) if task_id is not None else None
        if started is None:
            return
        failed = state in ("FAILURE", "RETRY") and isinstance(retval, BaseException)
        self._emit(time.monotonic() - started, failed and is_drop(retval, self.options.drop_exceptions))

    def _on_failure(self, exception: BaseException | None = None, **_: Any) -> None:
        # Only what the main process alone sees: children report their own failures via postrun.
        if os.getpid() == self._pid and isinstance(exception, (WorkerLostError, TimeLimitExceeded)):
            self.recorder.record(0.0, dropped=True)

    def _on_revoked(self, expired: bool = False, **_: Any) -> None:
        if expired and os.getpid() == self._pid:
            self.recorder.record(0.0, dropped=True)  # it waited past its expiry: overload, not a choice

    def on_task_received(self, req: Any) -> None:
        """Each task message: note whether it found every slot taken (it is already reserved)."""
        # Celery 5.7 keeps the pool alive while messages arrive through this hook (and adds it to
        # the consumer itself off the event loop); Celery 5.3 to 5.6 have no such method.
        base = getattr(super(), "on_task_received", None)
        if base is not None:
            base(req)
        if self._count_arrivals:
            self.recorder.arrived(full=len(worker_state.reserved_requests) - 1 >= self.controller.limit)

    # -- the loop ----------------------------------------------------------------------------

    def body(self) -> None:
        """Thread body for pools without the event loop (gevent, eventlet)."""
        with self.mutex:
            self.maybe_scale()
        time.sleep(min(self.options.tick, 0.25))

    def maybe_scale(self, req: Any = None) -> None:
        """Tick when due, or at once when a burst of drops arrives; cheap otherwise."""
        spent, resized = time.thread_time(), self._resize_spent
        if req is not None:
            self.on_task_received(req)
        if not self.enabled or _shutting_down():
            return
        if self.feed is not None:
            self.feed.drain(self.recorder)
        now = time.monotonic()
        # A callable gauge is read on every task message (it must be cheap); /proc every 100 ms.
        if self.options.ram_gauge is not None or now - self._ram_read_at >= RAM_EVERY:
            # RAM moves with what runs between ticks: the brake must see the peak, not one instant.
            self._read_ram(now)
        since = now - self._last_tick
        # An early tick only when it can cut: above the minimum, and with the last cut in force
        # (the controller never stacks cuts). So a 503 storm at the minimum, or while busy
        # children finish, doesn't turn into a storm of decisions and events.
        limit = self.controller.limit
        early = (
            limit > self.controller.min_limit
            and self.recorder.drop_burst(EARLY_DROPS, self.controller.drop_ratio)
            and len(worker_state.active_requests) <= limit
        )
        if early or since >= self.options.tick * 0.95:
            self.tick()
        # Deciding only: forking and reaping children (apply) is counted apart, as resize_pct.
        self._cpu_spent += time.thread_time() - spent - (self._resize_spent - resized)

    def tick(self) -> None:
        """Sample, decide, apply the limit and send the ``worker-flowcontrol`` event."""
        self._last_tick = time.monotonic()
        active = list(worker_state.active_requests)
        self._read_ram(self._last_tick)
        self._ram, self._ram_peak = self._ram_peak, None
        self._cpu_pct = self.options.cpu_gauge() if self.options.cpu_gauge else self.cpu.read()
        sample = self.recorder.sample(
            inflight=len(active), stalled=self._stalled(active), ram_pct=self._ram, cpu_pct=self._cpu_pct
        )
        decision = self.controller.tick(sample)
        if decision.changed:
            logger.info("AdaptiveAutoscaler: %s -> %s (%s)", decision.previous, decision.limit, decision.reason)
        self.apply(decision.limit)
        self._send_event()

    def _read_ram(self, now: float) -> None:
        value = self.options.ram_gauge() if self.options.ram_gauge else memory_percent()
        self._ram_read_at = now
        if value is not None and (self._ram_peak is None or value > self._ram_peak):
            self._ram_peak = value

    def _stalled(self, active: list[Any]) -> int:
        baseline = self.controller.baseline
        after = self.options.stall_after or (max(1.0, 10 * baseline) if baseline else None)
        if after is None:
            return 0
        now = time.time()  # Request.time_start is wall-clock
        return sum(1 for r in active if r.time_start and now - r.time_start > after)

    @property
    def processes(self) -> int:
        """The pool's size (Celery's ``num_processes`` is not that on gevent before 5.7)."""
        return pool_size(self.pool)

    def apply(self, limit: int) -> None:
        """Resize the pool towards ``limit`` (idle children only) and set prefetch in step."""
        started = time.thread_time()
        procs = self.processes
        if limit > procs:
            self._grow(limit - procs)
        elif limit < procs:
            self._shrink(procs - limit)  # billiard removes idle children only; retried each tick
        if limit != procs:
            resized(self.pool)
        self.pool.maintain_pool()
        self._resize_spent += time.thread_time() - started
        self._sync_prefetch(limit)

    def _shrink(self, n: int) -> None:
        # billiard counts a child as busy only once it has accepted its job, so a job written to
        # an "idle" child but not yet accepted would be lost with it (WorkerLostError). Wait for
        # every dispatched job to be accepted; the next tick tries again.
        if unaccepted_jobs(self.pool):
            return
        super()._shrink(n)

    def _sync_prefetch(self, limit: int) -> None:
        consumer: Any = getattr(self.worker, "consumer", None)
        qos = getattr(consumer, "qos", None)
        if consumer is None or qos is None or not getattr(consumer, "initial_prefetch_count", 0):
            return  # prefetch disabled, or the consumer isn't connected yet
        want = max(1, limit) * consumer.prefetch_multiplier
        if self.processes <= limit:
            # The pool size caps what runs, so a few messages may wait in the worker to hide the
            # broker round trip between tasks, and so that under a backlog an arriving task
            # reliably finds every slot taken (the demand signal; with one spare message it
            # sometimes doesn't, and a worker would sit at 2 slots on a backlog). While a cut waits on
            # busy children, no headroom: prefetch alone holds the cap and lets them go idle.
            want += max(2, -(-limit // 4))
        delta = want - qos.value
        if delta > 0:
            qos.increment_eventually(delta)
        elif delta < 0:
            qos.decrement_eventually(-delta)
        consumer.initial_prefetch_count = want  # so a reconnect restores our limit, not max

    def update(self, max: int | None = None, min: int | None = None) -> tuple[int, int]:
        """The ``autoscale`` remote command: new bounds, applied at once."""
        with self.mutex:
            if max is not None:
                self.max_concurrency = max
            if min is not None:
                self.min_concurrency = min
            limit = self.controller.set_bounds(self.min_concurrency, self.max_concurrency)
            if self.enabled:
                self.apply(limit)
            return self.max_concurrency, self.min_concurrency

    # -- figures ------------------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        """The live limit, in flight, RSS, CPU, throughput, p50/p95 and the last adjustment."""
        return figures_of(self)

    def info(self) -> dict[str, Any]:
        """What ``inspect stats`` shows under ``autoscaler``: Celery's keys plus our figures."""
        return {**super().info(), **self.figures()}

    def _send_event(self) -> None:
        dispatcher = getattr(getattr(self.worker, "consumer", None), "event_dispatcher", None)
        if dispatcher is not None and dispatcher.enabled:
            try:
                dispatcher.send("worker-flowcontrol", **self.figures())
            except Exception as exc:  # an event is best effort; never let it stop scaling
                logger.debug("AdaptiveAutoscaler: event not sent: %r", exc)

    def stop(self) -> None:
        """Stop the thread (when there is one), disconnect the task signals, close the children's pipe."""
        if self.is_alive():
            super().stop()
        for signal in (signals.task_prerun, signals.task_postrun, signals.task_failure, signals.task_revoked):
            signal.disconnect(dispatch_uid=f"flowcontrol-autoscale-{id(self)}-{signal.name}")
        if self.feed is not None:
            self.feed.close()


def figures_of(a: AdaptiveAutoscaler) -> dict[str, Any]:
    """What an autoscaler shows (``inspect flowcontrol_stats``, events, the dashboard's cards):
    the live limit, in flight, RSS, CPU, throughput, p50/p95 and the last adjustment."""
    last = a.controller.last
    pids = [os.getpid(), *(getattr(a.pool, "info", None) or {}).get("processes", [])]
    elapsed = max(time.monotonic() - a._born, 1e-9)
    return {
        "enabled": a.enabled,
        "limit": a.controller.limit,
        "min": a.min_concurrency,
        "max": a.max_concurrency,
        "processes": a.processes,
        "inflight": len(worker_state.active_requests),
        "rss_bytes": rss_bytes([p for p in pids if isinstance(p, int)]),
        "ram_pct": a._ram,
        "cpu_pct": a._cpu_pct,
        "throughput": round(a.recorder.throughput, 3),
        "p50_ms": None if a.recorder.p50 is None else round(a.recorder.p50 * 1000, 1),
        "p95_ms": None if a.recorder.p95 is None else round(a.recorder.p95 * 1000, 1),
        "baseline_ms": None if a.controller.baseline is None else round(a.controller.baseline * 1000, 1),
        "completed": a.recorder.completed,
        "dropped": a.recorder.dropped,
        # CPU of one core spent deciding (sampling, gauges, events), and forking/reaping children.
        # (Up to the last call before this one: an event is sent from inside a call.)
        "overhead_pct": round(100 * a._cpu_spent / elapsed, 4),
        "resize_pct": round(100 * a._resize_spent / elapsed, 4),
        "last_adjustment": None
        if last is None
        else {"limit": last.limit, "previous": last.previous, "reason": last.reason, "at": last.at},
    }
