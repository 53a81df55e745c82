"""A Redis "gauge" the e2e tasks use to measure themselves: in flight, peak, start and end times.

The tasks, not the flow-control code, are the witness: every task body calls :meth:`Gauge.enter`
first and :meth:`Gauge.exit` last (or runs inside :meth:`Gauge.measured`, which does both).
``enter`` is one Lua script (INCR the in-flight counter, raise the recorded peak, append the
start record, count the run), so the peak is exact across processes and nodes: two bodies
running at once always see each other's INCR.

Records are plain strings in Redis lists, one per execution (a redelivered task is a second
execution with its own id), so the test side can rebuild intervals even for executions that
never reached ``exit`` (a ``kill -9``).

Keys (all under ``<prefix>:g:``): ``inflight``, ``peak``, ``starts`` (list of
``exec|label|t|node``), ``ends`` (list of ``exec|label|t``), ``runs`` and ``done`` (hash label ->
count), ``arrived`` (hash label -> the first instant a worker got it, before admission; recorded by
projects that watch arrivals, :mod:`tests.support.projects.arrivals`), ``gate`` (set to ``1`` by
the test to let gate tasks finish), ``gated`` (hash flow queue -> how many runs admission let in
there, written by every project's ``task_prerun``).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

ENTER = """
local n = redis.call('INCR', KEYS[1])
local peak = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > peak then redis.call('SET', KEYS[2], n) end
redis.call('RPUSH', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[4], ARGV[2], 1)
return n
"""

EXIT = """
redis.call('DECR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
return 1
"""


@dataclass(frozen=True)
class Execution:
    """One run of one task body: ``end`` is None when the process died inside it."""

    exec_id: str
    label: str
    node: str
    start: float
    end: float | None


class Gauge:
    """The measuring side (in tasks) and the reading side (in tests) of one test's gauge."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.base = f"{prefix}:g:"
        # Any: redis-py 7 types every reply as ``Awaitable[T] | T`` (its async twin's too).
        self._client: Any = None
        self._pid = 0

    @property
    def client(self) -> Any:
        """A client owned by this process (a forked pool child must not share the parent's)."""
        if self._client is None or self._pid != os.getpid():
            self._client = redis.Redis.from_url(self.url)
            self._pid = os.getpid()
            self._enter = self._client.register_script(ENTER)
            self._exit = self._client.register_script(EXIT)
        return self._client

    def key(self, name: str) -> str:
        """The full Redis key of one gauge field."""
        return self.base + name

    # -- task side -----------------------------------------------------------------------------

    def enter(self, label: str) -> str:
        """Record the start of one execution of ``label``; returns the execution id."""
        self.client  # noqa: B018 - binds the scripts to this process's client
        exec_id = uuid.uuid4().hex[:12]
        node = os.environ.get("FCT_NODE", socket.gethostname())
        record = f"{exec_id}|{label}|{time.time():.6f}|{node}"
        keys = [self.key("inflight"), self.key("peak"), self.key("starts"), self.key("runs")]
        self._enter(keys=keys, args=[record, label])
        return exec_id

    def exit(self, exec_id: str, label: str) -> None:
        """Record the end of an execution started by :meth:`enter`."""
        self.client  # noqa: B018
        record = f"{exec_id}|{label}|{time.time():.6f}"
        self._exit(keys=[self.key("inflight"), self.key("ends"), self.key("done")], args=[record, label])

    @contextmanager
    def measured(self, label: str) -> Iterator[None]:
        """:meth:`enter`, the block, then :meth:`exit` even when the block raises (a task body)."""
        exec_id = self.enter(label)
        try:
            yield
        finally:
            self.exit(exec_id, label)

    def admitted_in(self, task: Any) -> None:
        """Count a run that admission let in, under the flow queue it was sent to (or its
        decorator's); a run that never went through admission carries no slot and no instant."""
        request = task.request
        if request.get("flow_slot") is None and request.get("flow_admitted_at") is None:
            return
        queue = request.get("flow_queue") or getattr(task, "flow_queue", None) or "?"
        self.client.hincrby(self.key("gated"), str(queue), 1)

    def arrive(self, label: str) -> None:
        """Record the instant ``label`` reached a worker (its first delivery only)."""
        self.client.hsetnx(self.key("arrived"), label, f"{time.time():.6f}")

    def gate_open(self) -> bool:
        """True once the test has opened the gate (gate tasks wait for it)."""
        return self.client.get(self.key("gate")) == b"1"

    # -- test side -----------------------------------------------------------------------------

    def open_gate(self) -> None:
        """Let every gate task finish."""
        self.client.set(self.key("gate"), "1")

    def peak(self) -> int:
        """The most task bodies ever seen running at once."""
        return int(self.client.get(self.key("peak")) or 0)

    def inflight(self) -> int:
        """Task bodies running now (counts executions killed inside their body forever)."""
        return int(self.client.get(self.key("inflight")) or 0)

    def started(self) -> int:
        """How many executions have started."""
        return int(self.client.llen(self.key("starts")))

    def finished(self) -> int:
        """How many executions have finished."""
        return int(self.client.llen(self.key("ends")))

    def runs(self) -> dict[str, int]:
        """Label -> how many executions started."""
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.key("runs")).items()}

    def done(self) -> dict[str, int]:
        """Label -> how many executions finished."""
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.key("done")).items()}

    def gated(self) -> dict[str, int]:
        """Flow queue -> how many runs admission let in there."""
        return {k.decode(): int(v) for k, v in self.client.hgetall(self.key("gated")).items()}

    def arrivals(self) -> dict[str, float]:
        """Label -> the instant it first reached a worker (see :meth:`arrive`)."""
        return {k.decode(): float(v) for k, v in self.client.hgetall(self.key("arrived")).items()}

    def executions(self) -> list[Execution]:
        """Every execution, in the order the bodies entered (Redis's order, one clock)."""
        ends: dict[str, float] = {}
        for raw in self.client.lrange(self.key("ends"), 0, -1):
            exec_id, _label, t = raw.decode().split("|")
            ends[exec_id] = float(t)
        runs = []
        for raw in self.client.lrange(self.key("starts"), 0, -1):
            exec_id, label, t, node = raw.decode().split("|", 3)
            runs.append(Execution(exec_id, label, node, float(t), ends.get(exec_id)))
        return runs

    def close(self) -> None:
        """Drop this process's connection."""
        if self._client is not None:
            self._client.close()
            self._client = None
