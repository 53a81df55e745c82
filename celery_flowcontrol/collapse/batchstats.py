"""How many ``flow_batch`` batches ran, and how many calls each held, per task.

Features
    ``record(task, size)`` counts one finished batch run (success or failure) of *size*
    calls; ``totals()`` reads every task's count, the sum of sizes and the size histogram
    (for ``flowcontrol_batches_total`` and ``flowcontrol_batch_size`` in metrics.py). A
    batch's run that is delivered again (its node was killed) is counted when it finishes.

Connection
    :class:`MemoryBatchStats`: one process (``memory://``: the process that runs the
    batches). :class:`RedisBatchStats`: one Redis hash, ``<prefix>:batchstats``, with the
    admission backend's client, so a scrape anywhere sees the whole fleet; each record is
    one MULTI of ``HINCRBY``.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SIZE_BUCKETS", "BatchStats", "BatchTotals", "MemoryBatchStats", "RedisBatchStats"]

#: Upper bounds of the batch size histogram's buckets (``size`` is at most 10,000).
SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000)


@dataclass(slots=True)
class BatchTotals:
    """One task's batches: how many ran, their calls in all, and how many fell in each of
    :data:`SIZE_BUCKETS` (not cumulative)."""

    count: int = 0
    calls: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * len(SIZE_BUCKETS))

    def cumulative(self) -> list[int]:
        """The bucket counts as Prometheus wants them: each bound counts all below it."""
        out, running = [], 0
        for n in self.buckets:
            running += n
            out.append(running)
        return out


def bucket_of(size: int) -> int:
    """The index in :data:`SIZE_BUCKETS` of the first bound at or above *size*."""
    return min(bisect.bisect_left(SIZE_BUCKETS, size), len(SIZE_BUCKETS) - 1)


class BatchStats:
    """The operations of the module docstring."""

    def record(self, task: str, size: int) -> None:
        """Count one finished batch of *task* holding *size* calls."""
        raise NotImplementedError

    def totals(self) -> dict[str, BatchTotals]:
        """Every task's :class:`BatchTotals`."""
        raise NotImplementedError


class MemoryBatchStats(BatchStats):
    """Counts of one process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, BatchTotals] = {}

    def record(self, task: str, size: int) -> None:
        with self._lock:
            t = self._totals.setdefault(task, BatchTotals())
            t.count += 1
            t.calls += size
            t.buckets[bucket_of(size)] += 1

    def totals(self) -> dict[str, BatchTotals]:
        with self._lock:
            return {k: BatchTotals(v.count, v.calls, list(v.buckets)) for k, v in self._totals.items()}


class RedisBatchStats(BatchStats):
    """Counts in one Redis hash, shared by every process with the same *key_prefix*; its
    fields are ``<task>|count``, ``<task>|calls`` and ``<task>|b<bucket index>``."""

    def __init__(self, client: Any, key_prefix: str = "fc") -> None:
        self.client = client
        self.key = f"{key_prefix}:batchstats"

    def record(self, task: str, size: int) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.hincrby(self.key, f"{task}|count", 1)
        pipe.hincrby(self.key, f"{task}|calls", size)
        pipe.hincrby(self.key, f"{task}|b{bucket_of(size)}", 1)
        pipe.execute()

    def totals(self) -> dict[str, BatchTotals]:
        out: dict[str, BatchTotals] = {}
        for raw, value in self.client.hgetall(self.key).items():
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            task, _, what = name.rpartition("|")
            t = out.setdefault(task, BatchTotals())
            n = int(value)
            if what == "count":
                t.count = n
            elif what == "calls":
                t.calls = n
            elif what.startswith("b") and what[1:].isdigit() and int(what[1:]) < len(SIZE_BUCKETS):
                t.buckets[int(what[1:])] = n
        return out
