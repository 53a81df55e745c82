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
        self._configs: dict[str, QueueConfig] = {}
        app.steps["consumer"].add(FlowControlStep)
        signals.before_task_publish.connect(self._stamp_headers, weak=False)
        signals.worker_shutdown.connect(self._on_worker_shutdown, weak=False)
        from . import beat

        beat.register_tasks(app)

    @classmethod
    def installed(cls, app: Any) -> FlowControl | None:
        """The FlowControl of *app*, or ``None`` if ``FlowControl(app)`` was never called."""
        return _INSTALLED.get(app)

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
        for config in s.queues:
            self.backend.register(config)
            self._configs[config.name] = config
        instance = f"{hostname}/{os.getpid()}/{uuid.uuid4().hex[:6]}"
        waker = Waker(app=self.app, backend=self.backend, store=self.store, instance=instance,
                      heartbeat_every=s.instance_ttl / 3, reclaim_every=s.reclaim_interval)
        self.gate = Gate(backend=self.backend, store=self.store, waker=waker,
                         instance=instance, configs=self.config_of)
        self.backend.heartbeat(instance)
        self._subscription = self.backend.subscribe_grants(waker.on_grant)
        waker.start()
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
        if self._subscription is not None:
            self._subscription.close()
        gate.waker.stop()

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


def register_queue(app: Any, config: QueueConfig | dict[str, Any]) -> QueueConfig:
    """Register (or replace) flow queue *config* on *app*'s backend at run time."""
    return FlowControl(app).register_queue(config)
