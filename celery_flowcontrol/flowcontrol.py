"""``FlowControl(app)``: the one facade that wires flow control into a Celery app.

::

    app = Celery("proj")
    app.conf.flowcontrol_queues = [{"name": "partner-api", "concurrency": 5}]
    FlowControl(app)

It adds the consumer bootstep, the producer hook that stamps flow headers on tasks sent by
name, the beat tasks ``flowcontrol.reclaim`` and ``flowcontrol.wake_due``, and gives the
CLI, the dashboard and the worker one place to reach the admission backend and the parking
store. Settings are read once, on first use, so ``FlowControl(app)`` may come before
``app.config_from_object(...)``.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
import weakref
from functools import cached_property
from typing import Any

from celery import signals

from .admission import backend_from_url
from .admission.base import AdmissionBackend, Subscription
from .config import QueueConfig
from .parking import ParkingStore
from .settings import FlowControlSettings, get_settings
from .worker.bootstep import FlowControlStep
from .worker.gate import Gate
from .worker.headers import KEY_HEADER, PRIORITY_HEADER, QUEUE_HEADER
from .worker.hold import Holds
from .worker.reassert import HeartbeatWatch, Reasserter
from .worker.waker import Waker

logger = logging.getLogger(__name__)

_INSTALLED: weakref.WeakKeyDictionary[Any, FlowControl] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()

#: Worker settings without which a cap can be exceeded or a task lost (see docs/worker.md).
EXACT_SETTINGS = (("task_acks_late", True), ("worker_prefetch_multiplier", 1),
                  ("task_reject_on_worker_lost", True))


class FlowControl:
    """Flow control for one Celery app; ``FlowControl(app)`` twice returns the same object."""

    app: Any
    gate: Gate | None

    def __new__(cls, app: Any) -> FlowControl:
        app = _unproxy(app)
        with _LOCK:
            existing = _INSTALLED.get(app)
            if existing is not None:
                return existing
            self = super().__new__(cls)
            self._install(app)
            _INSTALLED[app] = self
            return self

    def __init__(self, app: Any) -> None:
        """Install flow control on *app* (idempotent)."""

    def _install(self, app: Any) -> None:
        self.app = app
        self.gate = None
        self._subscription: Subscription | None = None
        self._watch: HeartbeatWatch | None = None
        self._configs: dict[str, QueueConfig] = {}
        app.steps["consumer"].add(FlowControlStep)
        # A uid of our own: Celery before 5.7 keys a bound method by its function alone, so
        # the hooks of a second app's FlowControl in one process were never connected.
        uid = f"flowcontrol-{id(self)}"
        signals.before_task_publish.connect(self._stamp_headers, weak=False, dispatch_uid=f"{uid}-stamp")
        signals.worker_shutdown.connect(self._on_worker_shutdown, weak=False, dispatch_uid=f"{uid}-shutdown")
        from . import beat
        from .worker import remote  # noqa: F401 - registers the flowcontrol_call command
        from .worker.control import register_stats_provider

        register_stats_provider("admission", self._admission_stats)

        beat.register_tasks(app)
        self._gate_pid: int | None = None

    @classmethod
    def installed(cls, app: Any) -> FlowControl | None:
        """The FlowControl of *app*, or ``None`` if ``FlowControl(app)`` was never called."""
        return _INSTALLED.get(_unproxy(app))

    # -- the engines ------------------------------------------------------------------------
    @cached_property
    def settings(self) -> FlowControlSettings:
        return get_settings(self.app)

    @cached_property
    def backend(self) -> AdmissionBackend:
        """The admission backend (``flowcontrol_backend`` or ``flowcontrol_backend_url``)."""
        s = self.settings
        if s.backend is not None:
            return s.backend() if callable(s.backend) and not isinstance(
                s.backend, AdmissionBackend) else s.backend
        return backend_from_url(s.backend_url, key_prefix=s.key_prefix,
                                instance_ttl=s.instance_ttl, grant_ttl=s.grant_ttl,
                                waiter_ttl=s.waiter_ttl)

    @cached_property
    def store(self) -> ParkingStore:
        """The parking store (``flowcontrol_parking_url``)."""
        return ParkingStore(self.settings.parking_url)

    @property
    def backend_is_local(self) -> bool:
        """True for the in-process backend: its state lives in one worker's main process."""
        from .admission.memory import MemoryBackend

        s = self.settings
        if s.backend is None:
            return s.backend_url.partition("://")[0].lower() == "memory"
        return isinstance(s.backend, MemoryBackend)

    def in_worker_main(self) -> bool:
        """True in the main process of a worker whose flow control is running."""
        return self.gate is not None and self._gate_pid == os.getpid()

    def call_backend(self, method: str, **kwargs: Any) -> Any:
        """Call an operator method of the backend (``release``, ``set_capacity``,
        ``set_max_hold``) from anywhere: directly when the backend is shared (Redis) or we
        are the worker that holds it, else through the workers' remote control."""
        if not self.backend_is_local or self.in_worker_main():
            return getattr(self.backend, method)(**kwargs)
        # In a pool process the worker that runs us holds the backend: ask it alone and stop
        # at its answer. Elsewhere ask every worker (an in-process backend means one, usually).
        from .errors import FlowControlError

        task = self.app.current_task  # the task running on this thread, or None
        hostname = getattr(getattr(task, "request", None), "hostname", None)
        call = {"method": method, "arguments": kwargs}
        if hostname:
            replies = self.app.control.broadcast("flowcontrol_call", arguments=call, reply=True,
                                                 timeout=5.0, destination=[hostname], limit=1)
        else:
            # A release needs the one worker that holds the slot: take the first answer, and
            # ask them all only when that one did not hold it. Overrides go to every worker.
            replies = self.app.control.broadcast("flowcontrol_call", arguments=call, reply=True,
                                                 timeout=5.0, limit=1) if method == "release" else []
            if not any(a.get("ok") for r in replies or [] for a in r.values()
                       if isinstance(a, dict)):
                replies = self.app.control.broadcast("flowcontrol_call", arguments=call,
                                                     reply=True, timeout=5.0)
        replies = replies or []
        answers = [a for reply in replies for a in reply.values() if isinstance(a, dict)]
        oks = [a["ok"] for a in answers if "ok" in a]
        if oks:
            return any(oks) if method == "release" else oks[0]
        errors = [str(a.get("error")) for a in answers]
        raise FlowControlError(
            errors[0] if errors else "no worker answered: the in-process (memory://) backend "
            "lives in a running worker's main process; start one, or use a redis:// backend")

    def set_capacity(self, name: str, capacity: int | None) -> None:
        """Override queue *name*'s capacity (``None`` resets to its config)."""
        self.call_backend("set_capacity", name=name, capacity=capacity)

    def set_max_hold(self, name: str, seconds: float | str | None) -> None:
        """Override queue *name*'s max_hold for slots granted from now on (``None`` resets)."""
        self.call_backend("set_max_hold", name=name, seconds=seconds)

    # -- queues -----------------------------------------------------------------------------
    def register_queue(self, config: QueueConfig | dict[str, Any]) -> QueueConfig:
        """Register (or replace) a flow queue at run time, fleet-wide for a shared backend."""
        config = QueueConfig.from_value(config)
        self.backend.register(config)
        self._configs[config.name] = config
        return config

    def config_of(self, name: str) -> QueueConfig | None:
        """The config of queue *name* as this process knows it (asks the backend once)."""
        config = self._configs.get(name)
        if config is None:
            for c in self.settings.queues:
                self._configs.setdefault(c.name, c)
            config = self._configs.get(name)
        if config is None:
            try:
                config = self.backend.get_config(name)
            except Exception:
                return None
            self._configs[name] = config
        return config

    # -- the worker side --------------------------------------------------------------------
    def start_worker(self, hostname: str) -> Gate:
        """Build this worker instance's gate (once), register the configured queues."""
        if self.gate is not None:
            return self.gate
        s = self.settings
        from .task import FlowTask, serial_config

        serial = [serial_config(t.name) for t in self.app.tasks.values()
                  if isinstance(t, FlowTask) and t.serial]
        for config in (*s.queues, *serial):
            self.backend.register(config)
            self._configs[config.name] = config
        instance = f"{hostname}/{os.getpid()}/{uuid.uuid4().hex[:6]}"
        waker = Waker(app=self.app, backend=self.backend, store=self.store, instance=instance,
                      heartbeat_every=s.instance_ttl / 3, reclaim_every=s.reclaim_interval)
        holds = Holds(s.hold)
        self.gate = Gate(backend=self.backend, store=self.store, waker=waker,
                         instance=instance, configs=self.config_of, holds=holds)
        waker.holds = holds
        holds.on_handed = waker.prewake
        waker.reassert = Reasserter(backend=self.backend, instance=instance,
                                    ledger=self.gate.ledger, configured=(*s.queues, *serial),
                                    config_of=self.config_of)
        self._watch = HeartbeatWatch(waker.reassert, s.instance_ttl / 3)
        self.backend.heartbeat(instance)
        self._subscription = self.backend.subscribe_grants(waker.on_grant)
        waker.start()
        self._watch.start()
        self._gate_pid = os.getpid()
        self._warn_inexact()
        logger.info("flowcontrol: instance %s admits through %s, parks in %s", instance,
                    type(self.backend).__name__, self.store)
        return self.gate

    def stop_worker(self) -> None:
        """Release what was admitted but never finished; stop the waker."""
        gate, self.gate = self.gate, None
        if gate is None:
            return
        gate.close()
        if self._watch is not None:
            self._watch.stop()
        if self._subscription is not None:
            self._subscription.close()
        gate.waker.stop()

    def _admission_stats(self, state: Any) -> dict[str, Any] | None:
        """This worker instance's admission figures, for ``inspect flowcontrol_stats``."""
        if getattr(getattr(state, "consumer", None), "app", None) is not self.app:
            return None
        return self.gate.stats() if self.gate is not None else None

    def _on_worker_shutdown(self, sender: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "app", None) is self.app:
            self.stop_worker()

    def _warn_inexact(self) -> None:
        from .task import FlowTask

        if not any(isinstance(t, FlowTask) for t in self.app.tasks.values()):
            return
        conf = self.app.conf
        off = [f"{k}={conf.get(k)!r}" for k, want in EXACT_SETTINGS if conf.get(k) != want]
        if off:
            logger.warning(
                "flowcontrol: caps are exact only with task_acks_late=True, "
                "worker_prefetch_multiplier=1 and task_reject_on_worker_lost=True; this worker "
                "has %s (see docs/worker.md)", ", ".join(off))

    # -- the producer side ------------------------------------------------------------------
    def _stamp_headers(self, sender: Any = None, headers: dict[str, Any] | None = None,
                       **kwargs: Any) -> None:
        """Give a FlowTask sent by name (``send_task``, beat) its decorator defaults."""
        task = self.app.tasks.get(sender) if isinstance(sender, str) else None
        if headers is None or task is None or QUEUE_HEADER in headers:
            return
        queue = getattr(task, "flow_queue", None)
        if not queue:
            return
        headers[QUEUE_HEADER] = queue
        if getattr(task, "flow_priority", 0):
            headers.setdefault(PRIORITY_HEADER, task.flow_priority)
        if getattr(task, "fairness_key", None):
            headers.setdefault(KEY_HEADER, task.fairness_key)


def _unproxy(app: Any) -> Any:
    """The app behind ``celery.current_app`` (a proxy can't key a weak dictionary)."""
    getter = getattr(app, "_get_current_object", None)
    return getter() if callable(getter) else app


def register_queue(app: Any, config: QueueConfig | dict[str, Any]) -> QueueConfig:
    """Register (or replace) flow queue *config* on *app*'s backend at run time."""
    return FlowControl(app).register_queue(config)
