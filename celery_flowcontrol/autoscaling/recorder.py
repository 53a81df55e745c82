"""Per-task outcomes gathered between ticks, and the pipe that carries them out of pool children.

:class:`TickRecorder` is what the controller reads: every finished task is ``record()``-ed with
its latency and whether it was a drop; ``sample()`` turns the tick's records into a
:class:`~celery_flowcontrol.autoscaling.controller.TickSample`. It is shared by the Celery
autoscaler and the virtual-clock simulation, so both feed the controller the same figures.

:class:`PipeFeed` exists because prefork runs tasks in child processes: the timing is taken in
the child (where ``task_prerun``/``task_postrun`` fire), and one fixed-size record per task goes
to the parent through a pipe created before the children fork. Writes of at most ``PIPE_BUF``
bytes to a pipe are atomic, so children never interleave records; the write end is non-blocking,
so a parent that stopped reading costs a child nothing but a lost sample.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

from .controller import TickSample, percentile

__all__ = ["PipeFeed", "TickRecorder"]

_RECORD = struct.Struct("<d?")  # latency seconds, dropped


class TickRecorder:
    """Collect task outcomes between ticks; ``record`` is safe from any thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._pending: deque[tuple[float, bool]] = deque()
        # Approximate counters for drop_burst() and arrivals; a lost increment under a race is harmless.
        self._pending_drops = 0
        self._arrived = 0
        self._arrived_full = 0
        self._last_tick = clock()
        self.completed = 0
        self.dropped = 0
        self.throughput = 0.0
        self.p50: float | None = None
        self.p95: float | None = None

    def record(self, latency: float, dropped: bool = False) -> None:
        """Note one finished task: ``latency`` in seconds; ``dropped`` for timeouts, lost workers, infra errors."""
        self._pending.append((latency, dropped))
        if dropped:
            self._pending_drops += 1

    def arrived(self, full: bool) -> None:
        """Note one task arriving at the worker; ``full``: every slot was taken when it came."""
        self._arrived += 1
        if full:
            self._arrived_full += 1

    def drop_burst(self, min_drops: int, ratio: float) -> bool:
        """True when at least ``min_drops`` drops, over ``ratio`` of what finished, wait for a tick.

        Fast failures (a 503 storm) can burn through a backlog in less than one tick; the
        autoscaler checks this on each task message and ticks early instead of waiting.
        """
        drops = self._pending_drops
        return drops >= min_drops and drops > ratio * len(self._pending)

    def sample(
        self,
        *,
        inflight: int,
        stalled: int = 0,
        ram_pct: float | None = None,
        cpu_pct: float | None = None,
    ) -> TickSample:
        """Drain what finished since the last call into one :class:`TickSample`."""
        now = self.clock()
        elapsed = max(now - self._last_tick, 1e-9)
        self._last_tick = now
        latencies: list[float] = []
        drops = 0
        busy_seconds = 0.0
        pending = self._pending
        self._pending_drops = 0
        while pending:
            latency, dropped = pending.popleft()
            # Little's law: task-seconds finished in the tick / tick length = mean in flight.
            busy_seconds += latency
            if dropped:
                drops += 1
            else:
                latencies.append(latency)
        self.completed += len(latencies)
        self.dropped += drops
        self.throughput = len(latencies) / elapsed
        self.p50 = percentile(latencies, 50)
        self.p95 = percentile(latencies, 95)
        # With nothing finished (long tasks, a stall) the in-flight count is the only figure.
        busy = busy_seconds / elapsed if busy_seconds else float(inflight)
        arrived, full = self._arrived, self._arrived_full
        self._arrived = self._arrived_full = 0
        queued = full / arrived if arrived else None
        return TickSample(tuple(latencies), drops, stalled, inflight, busy, ram_pct, cpu_pct, queued)


class PipeFeed:
    """A pipe from pool children to the parent carrying one ``(latency, dropped)`` record per task."""

    def __init__(self) -> None:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self.parent_pid = os.getpid()
        self._lock = threading.Lock()
        self._partial = b""

    def send(self, latency: float, dropped: bool) -> None:
        """Write one record; never blocks (a full pipe loses the sample, not the task's time)."""
        try:
            os.write(self._write_fd, _RECORD.pack(latency, dropped))
        except (BlockingIOError, OSError):
            pass

    def drain(self, into: TickRecorder) -> int:
        """Move every complete record waiting in the pipe into ``into``; returns how many."""
        count = 0
        with self._lock:
            chunks = [self._partial]
            while True:
                try:
                    chunk = os.read(self._read_fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            data = b"".join(chunks)
            usable = len(data) - len(data) % _RECORD.size
            self._partial = data[usable:]
            for latency, dropped in _RECORD.iter_unpack(data[:usable]):
                into.record(latency, dropped)
                count += 1
        return count

    def close(self) -> None:
        """Close both ends (the parent does this at shutdown)."""
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
