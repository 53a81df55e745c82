"""A pytest plugin to test your own flow-controlled tasks, with no server (docs/testing.md).

Load it in a ``conftest.py``, or with ``pytest -p celery_flowcontrol.pytest``::

    pytest_plugins = ["celery_flowcontrol.pytest"]

It is not loaded by itself (no ``pytest11`` entry point): installing celery-flowcontrol
changes no one's test run. Its fixtures work with or without pytest-celery installed, and
use none of the fixture names of ``celery.contrib.pytest`` or pytest-celery (``celery_app``,
``celery_worker``...), so they shadow nothing and nothing shadows them; a ``celery_config``
fixture, yours or theirs, is read.

``flowcontrol_app``
    A Celery app with an in-memory broker (``memory://``) and result backend
    (``cache+memory://``), your ``celery_config`` fixture's settings applied over the
    defaults (:data:`DEFAULTS`), and :class:`~celery_flowcontrol.FlowControl` installed with
    the in-process admission backend on a test clock and a SQLite parking table under the
    test's ``tmp_path``. The broker, the result backend, the admission backend and the
    parking URL are always the plugin's, whatever ``celery_config`` says. The app is the
    current and default one during the test, so ``shared_task``\\ s bind to it.
``flowcontrol_worker``
    An in-thread worker of that app: Celery's own ``start_worker`` (the ``threads`` pool,
    4 threads, so that a concurrency cap has something to hold back), with the
    ``flowcontrol_worker_parameters`` fixture's keywords (``{}``; override it) passed on.
``flowcontrol``
    :class:`FlowControlHelpers` on that app: ``parked(queue)``, ``busy(queue)``,
    ``advance(seconds)``, ``wake_due()``.

The clock: admission, wake times and ETAs run on a :class:`~celery_flowcontrol.testing.FakeClock`
that starts at the whole second the test starts and moves only through ``advance``, so what
a rate window admits does not depend on when the test runs. ``app.now()`` reads it too (a
``countdown`` counts from it) and the worker's timer waits out an ETA by it. Celery's worker
still judges a task's ``expires`` on the real clock.

Under ``task_always_eager`` flow control is bypassed, as Celery bypasses its own
``rate_limit``: the task runs at once, in the caller, and nothing is admitted or parked.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import datetime, timezone
from typing import Any

import celery.contrib.testing.tasks  # noqa: F401 - registers celery.ping, start_worker's check
import pytest
from celery import Celery, signals
from celery.contrib.testing.app import setup_default_app
from celery.contrib.testing.worker import start_worker
from celery.states import READY_STATES
from celery.utils.timer2 import Timer
from kombu.asynchronous.timer import Timer as Schedule

from .admission.memory import MemoryBackend
from .flowcontrol import FlowControl
from .protocol import QUEUE_HEADER
from .testing.support import FakeClock
from .worker.republish import wake_due
from .worker.runtime_registry import runtime_of

__all__ = ["DEFAULTS", "FlowControlHelpers", "FlowControlTestApp", "flowcontrol",
           "flowcontrol_app", "flowcontrol_worker", "flowcontrol_worker_parameters"]

#: Settings of ``flowcontrol_app`` that ``celery_config`` may change: Celery's exactness
#: settings (docs/worker.md), and no lingering, so that every denied task is parked (and
#: counted by ``parked``) at once.
DEFAULTS: dict[str, Any] = {
    "task_acks_late": True,
    "worker_prefetch_multiplier": 1,
    "task_reject_on_worker_lost": True,
    "worker_hijack_root_logger": False,
    "flowcontrol_linger": 0,
}
#: The worker's defaults; ``flowcontrol_worker_parameters`` changes them.
WORKER_DEFAULTS: dict[str, Any] = {"pool": "threads", "concurrency": 4, "shutdown_timeout": 10.0}
#: How long ``parked`` and ``busy`` wait for the worker to decide what was sent before counting.
SETTLE_TIMEOUT = 5.0


class FlowControlTestApp(Celery):
    """A Celery app whose ``now()`` reads *clock*, so that a ``countdown`` or ``expires``
    counts from the test's clock."""

    def __init__(self, *args: Any, clock: Callable[[], float], **kwargs: Any) -> None:
        self.test_clock = clock  # not ``clock``: Celery's app has its Lamport clock there
        super().__init__(*args, **kwargs)

    def now(self) -> datetime:
        """Now on the test's clock, in the app's timezone."""
        return datetime.fromtimestamp(self.test_clock(), timezone.utc).astimezone(self.timezone)

    def __reduce_keys__(self) -> dict[str, Any]:
        # A pickled app (a process pool's) is rebuilt with the clock too.
        return {**super().__reduce_keys__(), "clock": self.test_clock}


def clocked_timer(clock: Callable[[], float]) -> type[Timer]:
    """A worker timer class that waits out an ETA by *clock*: an entry due at ETA *t* runs
    after ``t - clock()`` real seconds (at once for a parked ETA task woken by ``advance``)."""

    class ClockedSchedule(Schedule):
        def call_at(self, eta: Any, fun: Any, args: Any = (), kwargs: Any = None,
                    priority: int = 0) -> Any:
            # Celery hands an ETA over on the monotonic scale (kombu's to_timestamp).
            wall = eta.timestamp() if isinstance(eta, datetime) else \
                eta + time.time() - time.monotonic()
            due = time.monotonic() + max(0.0, wall - clock())
            return super().call_at(due, fun, args, kwargs or {}, priority)

    class ClockedTimer(Timer):
        Schedule = ClockedSchedule

    return ClockedTimer


class FlowControlHelpers:
    """What a test reads and moves of its app's flow control (the ``flowcontrol`` fixture)."""

    def __init__(self, app: Celery, clock: FakeClock) -> None:
        self.app = app
        self.clock = clock
        self.fc = FlowControl(app)
        # Flow-controlled messages sent and not seen starting: until each is parked, started
        # or finished, the worker has not decided it yet (see _settle).
        self._unstarted: set[str] = set()
        uid = f"flowcontrol-pytest-{id(self)}"
        signals.after_task_publish.connect(self._sent, weak=False, dispatch_uid=uid)
        signals.task_prerun.connect(self._started, weak=False, dispatch_uid=uid)
        self._uid = uid

    def close(self) -> None:
        """Disconnect the signal receivers (the fixture does it at teardown)."""
        signals.after_task_publish.disconnect(dispatch_uid=self._uid)
        signals.task_prerun.disconnect(dispatch_uid=self._uid)

    def _sent(self, sender: Any = None, headers: dict[str, Any] | None = None,
              **kwargs: Any) -> None:
        if headers and headers.get(QUEUE_HEADER) and headers.get("id"):
            self._unstarted.add(str(headers["id"]))

    def _started(self, task_id: str | None = None, **kwargs: Any) -> None:
        self._unstarted.discard(str(task_id))

    def _settle(self, timeout: float = SETTLE_TIMEOUT) -> None:
        """Wait (up to *timeout* s) until the running worker has decided every flow-controlled
        message sent so far: parked, started or finished. A woken message is undecided again
        until it comes back through admission. Without a worker, nothing is awaited."""
        if self.fc.gate is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not [t for t in list(self._unstarted) if not self._decided(t)]:
                return
            time.sleep(0.01)

    def _decided(self, task_id: str) -> bool:
        if task_id not in self._unstarted or self.fc.store.get(task_id) is not None:
            return True
        if self.app.AsyncResult(task_id).state in READY_STATES:  # revoked, expired
            self._unstarted.discard(task_id)
            return True
        return False

    def parked(self, queue: str | None = None) -> int:
        """How many tasks of flow queue *queue* (of every queue: ``None``) are parked, once
        the worker has decided what was sent (waits up to 5 s for it)."""
        self._settle()
        return self.fc.store.count(queue)

    def busy(self, queue: str) -> int:
        """How many slots of flow queue *queue* are busy, once the worker has decided what
        was sent (waits up to 5 s for it)."""
        self._settle()
        return self.fc.backend.stats(queue).in_use

    def advance(self, seconds: float) -> float:
        """Move the test's clock forward by *seconds*: rate windows, ETAs, parked tasks'
        wake times, ``max_hold`` and every TTL see that much time pass, while the worker
        stays alive through it (it heartbeats as it would). Returns the new now."""
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or \
                not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"advance: seconds must be a number >= 0, got {seconds!r}")
        step = self.fc.settings.instance_ttl / 3  # the worker's own heartbeat period
        left = float(seconds)
        while left > 0:
            self.clock.advance(min(step, left))
            left -= step
            runtime = runtime_of(self.app)  # the worker's instance, where one runs
            if runtime is not None:
                self.fc.backend.heartbeat(runtime.instance)
        return self.clock()

    def wake_due(self) -> int:
        """Publish again every parked task whose wake time has come, now, without waiting
        for the worker's poller; how many."""
        runtime = runtime_of(self.app)
        if runtime is not None:
            return int(runtime.waker.wake_due())
        return wake_due(self.app, self.fc.store, self.clock, backend=self.fc.backend)


def _user_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The ``celery_config`` fixture's settings, when one is defined (yours, or the
    ``{}`` of ``celery.contrib.pytest``)."""
    try:
        return dict(request.getfixturevalue("celery_config"))
    except pytest.FixtureLookupError:
        return {}


@pytest.fixture
def flowcontrol_clock() -> FakeClock:
    """The test's clock (see the module docstring): a FakeClock at the current whole second."""
    return FakeClock(math.floor(time.time()))


@pytest.fixture
def flowcontrol_app(request: pytest.FixtureRequest, tmp_path: Any,
                    flowcontrol_clock: FakeClock) -> Iterator[Celery]:
    """A Celery app with flow control and no server (see the module docstring)."""
    config = {**DEFAULTS, **_user_config(request)}
    config.update(
        broker_url="memory://", result_backend="cache+memory://",
        # kombu polls the in-memory queues once a second by default: a parked task woken
        # would wait that long to come back.
        broker_transport_options={"polling_interval": 0.01},
        flowcontrol_backend=MemoryBackend(clock=flowcontrol_clock),
        flowcontrol_parking_url=f"sqlite:///{tmp_path / 'flowcontrol.sqlite3'}",
    )
    for key in [k for k in config if k.lower() == "flowcontrol_backend_url"]:
        del config[key]  # the ready backend above is the one used
    app = FlowControlTestApp("flowcontrol_tests", clock=flowcontrol_clock, set_as_current=False)
    app.conf.update(config)
    with setup_default_app(app):
        app.set_current()
        app.set_default()
        fc = FlowControl(app)
        for queue in fc.settings.queues:  # as a worker does at boot: busy() can read them now
            fc.register_queue(queue)
        try:
            yield app
        finally:
            fc.store.close()


@pytest.fixture
def flowcontrol_worker_parameters() -> dict[str, Any]:
    """Keywords for ``start_worker`` (override it: ``{"concurrency": 8}``)."""
    return {}


@pytest.fixture
def flowcontrol_worker(flowcontrol_app: Celery, flowcontrol_clock: FakeClock,
                       flowcontrol_worker_parameters: dict[str, Any]) -> Iterator[Any]:
    """An in-thread worker of ``flowcontrol_app`` (Celery's ``start_worker``)."""
    params = {**WORKER_DEFAULTS, "timer_cls": clocked_timer(flowcontrol_clock),
              **flowcontrol_worker_parameters}
    root = logging.getLogger()
    level = root.level  # the worker sets the root logger's level: keep caplog's as it was
    with ExitStack() as stack:
        stack.callback(root.setLevel, level)
        yield stack.enter_context(start_worker(flowcontrol_app, **params))


@pytest.fixture
def flowcontrol(flowcontrol_app: Celery, flowcontrol_clock: FakeClock) -> Iterator[FlowControlHelpers]:
    """Helpers on ``flowcontrol_app``: ``parked``, ``busy``, ``advance``, ``wake_due``."""
    helpers = FlowControlHelpers(flowcontrol_app, flowcontrol_clock)
    try:
        yield helpers
    finally:
        helpers.close()
