"""The dashboard's memory: a ring buffer of samples per queue, filled by a background thread.

Every ``every`` seconds (2 s) the :class:`~celery_flowcontrol.metrics.Sampler` takes one pass
over the queues; each queue's point (admissions and denials per second over the interval, wait
p50/p95 of the waits that ended in it, busy and waiting) goes into a deque holding ``window``
seconds (15 minutes). Nothing is stored anywhere else: a restarted dashboard starts empty.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..metrics import QueueSample, Sampler

__all__ = ["History", "SamplerThread", "percentile"]

logger = logging.getLogger(__name__)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank *q*-th percentile (0..100) of *values*, ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class History:
    """Points of the last *window* seconds, per queue, sampled every *every* seconds."""

    FIELDS = ("t", "admitted", "denied", "p50", "p95", "in_use", "waiting")

    def __init__(self, every: float = 2.0, window: float = 900.0) -> None:
        self.every = every
        self.size = max(1, int(window / every))
        self._series: dict[str, deque[tuple[Any, ...]]] = {}
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, samples: dict[str, QueueSample]) -> None:
        """Append one point per queue; queues that are gone lose their series."""
        with self._lock:
            for name in set(self._series) - set(samples):
                del self._series[name]
                self._last.pop(name, None)
            for name, s in samples.items():
                series = self._series.setdefault(name, deque(maxlen=self.size))
                previous = self._last.get(name)
                self._last[name] = s.t
                if previous is None:
                    continue  # the first pass only sets the baselines of the counters
                span = max(s.t - previous, 1e-6)
                series.append((round(s.t, 3), round(s.admitted / span, 3),
                               round(sum(s.denied.values()) / span, 3),
                               _round(percentile(s.waits, 50)), _round(percentile(s.waits, 95)),
                               s.row.in_use, s.row.waiting))

    def series(self, name: str | None = None) -> dict[str, dict[str, list[Any]]]:
        """Column-wise series: ``{queue: {"t": [...], "admitted": [...], ...}}``."""
        with self._lock:
            names = [name] if name is not None else sorted(self._series)
            out = {}
            for n in names:
                points = list(self._series.get(n, ()))
                out[n] = {f: [p[i] for p in points] for i, f in enumerate(self.FIELDS)}
            return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class SamplerThread(threading.Thread):
    """Samples every ``history.every`` seconds into *history* until :meth:`stop`."""

    def __init__(self, sampler: Sampler, history: History,
                 on_error: Callable[[Exception], None] | None = None) -> None:
        super().__init__(name="flowcontrol-dashboard-sampler", daemon=True)
        self.sampler = sampler
        self.history = history
        self.on_error = on_error
        self.last_error: str | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            started = time.monotonic()
            try:
                self.history.add(self.sampler.sample())
                self.last_error = None
            except Exception as exc:  # an outage must not kill the thread: the charts just pause
                if self.last_error is None:
                    logger.warning("flowcontrol dashboard: sampling failed: %s", exc)
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self.on_error is not None:
                    self.on_error(exc)
            self._halt.wait(max(0.0, self.history.every - (time.monotonic() - started)))

    def stop(self) -> None:
        """Stop after the current pass."""
        self._halt.set()
