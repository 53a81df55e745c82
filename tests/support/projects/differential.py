"""The e2e project of the differential test: ordinary Celery tasks, gated or not.

With ``FCT_FLOW=1`` every task is a ``FlowTask`` of the one flow queue ``diff`` (its capacity
comes from ``FCT_CONF``); with ``FCT_FLOW=0`` the very same tasks are plain Celery tasks. Each
task takes a ``label`` keyword, and the worker writes what happened to it into one Redis list
(``<prefix>:diff:events``), as JSON:

* ``["exec", label, retries]`` each time a task body starts;
* ``["task_success" | "task_failure" | "task_retry" | "task_revoked", label, ...]`` for each
  of those Celery signals, with what they say (exception type and text, the revoke flags).

The test compares these, and the states and results in the result backend, between a gated and
a plain worker. ``FCT_RESULT_BACKEND`` is a Redis URL or a ``db+`` SQLAlchemy URL (Celery's
default table names: the test gives the connection a schema of its own).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import redis
from celery import Celery, Task, chain, signals
from celery.exceptions import Ignore, Reject, SoftTimeLimitExceeded

from tests.support.harness import Harness
from tests.support.projects.base import base_app

FLOW_QUEUE = "diff"


class Recorder:
    """Appends JSON events to the test's Redis list; one client per process (prefork forks)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.key = f"{prefix}:diff:events"
        self.flags = f"{prefix}:diff:flag:"
        self._client: redis.Redis | None = None
        self._pid = 0

    @property
    def client(self) -> redis.Redis:
        if self._client is None or self._pid != os.getpid():
            self._client = redis.Redis.from_url(self.url)
            self._pid = os.getpid()
        return self._client

    def record(self, *event: Any) -> None:
        self.client.rpush(self.key, json.dumps(event, default=str))

    def first(self, name: str) -> bool:
        """True the first time *name* is asked for, fleet-wide."""
        return bool(self.client.set(self.flags + name, 1, nx=True))

    def flag(self, name: str) -> bool:
        return bool(self.client.exists(self.flags + name))

    def events(self) -> list[list[Any]]:
        return [json.loads(raw) for raw in self.client.lrange(self.key, 0, -1)]


def label_of(kwargs: Any) -> str | None:
    return kwargs.get("label") if isinstance(kwargs, dict) else None


def exc_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def create_app(env: Mapping[str, str]) -> Celery:
    """The app of one differential run (module docstring)."""
    prefix = env["FCT_PREFIX"]
    flow = env.get("FCT_FLOW", "1") == "1"
    assert env["FCT_RESULT_BACKEND"], "the differential test reads every state from the results"
    app = base_app(env, task_track_started=True)
    rec = Recorder(env.get("FCT_GAUGE_URL", "redis://127.0.0.1:6379/0"), prefix)
    base: type[Task] = Task
    gated: dict[str, Any] = {}
    if flow:
        from celery_flowcontrol import FlowControl, FlowTask

        FlowControl(app)
        base = FlowTask
        gated = {"flow_queue": FLOW_QUEUE}

    def task(**options: Any) -> Any:
        return app.task(shared=False, base=base, bind=True, **gated, **options)

    def enter(self: Task, label: str) -> int:
        retries = int(self.request.retries or 0)
        rec.record("exec", label, retries)
        return retries

    @task(name="proj.add")
    def add(self: Task, x: int, y: int, label: str) -> int:
        enter(self, label)
        return x + y

    @task(name="proj.tsum")
    def tsum(self: Task, values: list[Any], label: str) -> int:
        enter(self, label)
        return sum(values)

    @task(name="proj.collect")
    def collect(self: Task, values: list[Any], label: str) -> list[str]:
        enter(self, label)
        return sorted(map(str, values))

    @task(name="proj.fail")
    def fail(self: Task, *args: Any, label: str) -> None:
        enter(self, label)
        raise ValueError(f"failed {label}")

    @task(name="proj.retrier", max_retries=3)
    def retrier(self: Task, how: str, label: str) -> str:
        """Retries the way *how* says, then returns what its last run saw."""
        retries = enter(self, label)
        if how == "long_countdown" and retries < 1:
            raise self.retry(countdown=3)
        if how == "countdown" and retries < 2:
            raise self.retry(countdown=0.2)
        if how == "eta" and retries < 1:
            raise self.retry(eta=datetime.now(timezone.utc) + timedelta(seconds=0.5))
        if how == "max":
            raise self.retry(countdown=0.1, max_retries=2)
        if how == "max_exc":
            raise self.retry(exc=KeyError(label), countdown=0.1, max_retries=1)
        if how == "expires" and retries < 1:
            raise self.retry(countdown=0.1, expires=60)
        if how == "expires_passes" and retries < 1:
            # Due after it expires: Celery revokes it (expired) instead of running it.
            raise self.retry(countdown=2, expires=1)
        if how == "priority_headers" and retries < 1:
            raise self.retry(countdown=0.1, priority=3, headers={"diff_custom": "kept"})
        # The broker priority a run sees: a FlowTask is sent with plain Celery's, and a woken
        # one is shown the priority it was sent with (worker/message.py).
        info = self.request.delivery_info or {}
        if how != "priority_headers":
            return f"{how}:{retries}:{info.get('priority')}"
        return f"{how}:{retries}:{info.get('priority')}:{getattr(self.request, 'diff_custom', None)}"

    @task(name="proj.errback")
    def errback(self: Task, task_id: str, label: str) -> str:
        """A ``link_error`` callback (bound: Celery sends it the failed task's id)."""
        enter(self, label)
        return f"{task_id}: {self.AsyncResult(task_id).state}"

    @task(name="proj.fate")
    def fate(self: Task, how: str, label: str) -> str:
        """Ends as *how* says: Reject, Ignore, or the pool child dying on its first run."""
        enter(self, label)
        if how == "reject":
            raise Reject("as told", requeue=False)
        if how == "ignore":
            raise Ignore()
        if how == "exit" and rec.first(label):
            os._exit(1)  # WorkerLostError in the main process; reject_on_worker_lost requeues
        return how

    @task(name="proj.auto", autoretry_for=(ValueError,), retry_backoff=1, retry_jitter=False,
          max_retries=2)
    def auto(self: Task, until: int, label: str) -> int:
        """Raises ValueError while ``retries < until`` (autoretry with backoff 1 s, 2 s)."""
        retries = enter(self, label)
        if retries < until:
            raise ValueError(f"auto {label} {retries}")
        return retries

    @task(name="proj.replacer")
    def replacer(self: Task, how: str, label: str) -> Any:
        enter(self, label)
        if how == "one":
            return self.replace(add.s(2, 3, label=f"{label}.r"))
        return self.replace(chain(add.s(1, 1, label=f"{label}.r1"), add.s(10, label=f"{label}.r2")))

    @task(name="proj.soft", soft_time_limit=0.5)
    def soft(self: Task, catch: bool, label: str) -> str:
        enter(self, label)
        try:
            time.sleep(10)
        except SoftTimeLimitExceeded:
            if catch:
                return "caught"
            raise
        return "slept"

    @task(name="proj.hard", time_limit=1)
    def hard(self: Task, label: str) -> str:
        enter(self, label)
        time.sleep(10)
        return "slept"

    @task(name="proj.hard_once", time_limit=1, acks_on_failure_or_timeout=False)
    def hard_once(self: Task, label: str) -> str:
        """Times out on its first run only: not acked, Celery requeues it, and it runs again."""
        enter(self, label)
        if rec.first(label):
            time.sleep(10)
        return "second run"

    @task(name="proj.fail_noack", acks_on_failure_or_timeout=False)
    def fail_noack(self: Task, label: str) -> None:
        enter(self, label)
        raise ValueError(f"failed {label}")

    @task(name="proj.started")
    def started(self: Task, label: str) -> str:
        """What the result backend says of this very task while it runs (track_started)."""
        enter(self, label)
        return str(self.AsyncResult(self.request.id).state)

    @task(name="proj.block")
    def block(self: Task, label: str) -> str:
        """Runs until the test raises its flag (or 30 s pass): a task to revoke mid-run."""
        enter(self, label)
        deadline = time.monotonic() + 30
        while not rec.flag(f"release:{label}") and time.monotonic() < deadline:
            time.sleep(0.05)
        return "released"

    def ours(sender: Any) -> bool:
        return getattr(sender, "app", None) is app

    @signals.task_success.connect(weak=False)
    def on_success(sender: Any = None, result: Any = None, **kw: Any) -> None:
        label = label_of(getattr(sender.request, "kwargs", None)) if ours(sender) else None
        if label:
            rec.record("task_success", label, repr(result))

    @signals.task_failure.connect(weak=False)
    def on_failure(sender: Any = None, exception: Any = None, kwargs: Any = None,
                   **kw: Any) -> None:
        label = label_of(kwargs) if ours(sender) else None
        if label:
            rec.record("task_failure", label, exc_text(exception))

    @signals.task_retry.connect(weak=False)
    def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **kw: Any) -> None:
        label = label_of(getattr(request, "kwargs", None)) if ours(sender) else None
        if label:
            rec.record("task_retry", label, type(reason).__name__)

    @signals.task_revoked.connect(weak=False)
    def on_revoked(sender: Any = None, request: Any = None, terminated: Any = None,
                   signum: Any = None, expired: Any = None, **kw: Any) -> None:
        label = label_of(getattr(request, "kwargs", None)) if ours(sender) else None
        if label:
            rec.record("task_revoked", label, bool(terminated), bool(expired), str(signum))

    app.recorder = rec  # type: ignore[attr-defined]
    return app


class DifferentialHarness(Harness):
    """A :class:`Harness` running this module's project."""

    project = "tests.support.projects.differential"
