"""``FlowControl(app)``: the one facade that wires flow control into a Celery app.

::

    app = Celery("proj")
    app.conf.flowcontrol_queues = [{"name": "partner-api", "concurrency": 5}]
    FlowControl(app)

It adds the consumer bootstep and what worker/runtime.py's ``install`` connects (the
producer hook that stamps flow headers on tasks sent by name, the beat tasks
``flowcontrol.reclaim`` and ``flowcontrol.wake_due``, the remote-control command), and gives
operators (the CLI, the dashboard, the metrics) and user code one place to read and steer the
admission backend and the parking store (engines.py builds them). Settings are validated in
every process that calls it, when the app's configuration is loaded (at once if it already is),
and read once, on first use, so ``FlowControl(app)`` may come before ``app.config_from_object(...)``.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from .admission.base import AdmissionBackend
from .config import QueueConfig
from .engines import Engines, engines_of, unproxy
from .parking import ParkingStore
from .parking.engine import parking_url
from .settings import FlowControlSettings, read_settings
from .worker.backend_calls import call_backend, in_worker_main
from .worker.bootstep import FlowControlStep
from .worker.gate import Gate
from .worker.runtime import EXACT_SETTINGS, install
from .worker.runtime_registry import runtime_of

__all__ = ["EXACT_SETTINGS", "FlowControl", "register_queue"]

_INSTALLED: weakref.WeakKeyDictionary[Any, FlowControl] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class FlowControl:
    """Flow control for one Celery app; ``FlowControl(app)`` twice returns the same object."""

    app: Any
    engines: Engines

    def __new__(cls, app: Any) -> FlowControl:
        app = unproxy(app)
        with _LOCK:
            existing = _INSTALLED.get(app)
            if existing is not None:
                return existing
            _check_settings(app)
            self = super().__new__(cls)
            self.app = app
            self.engines = engines_of(app)
            _INSTALLED[app] = self
        app.steps["consumer"].add(FlowControlStep)
        install(app)
        return self

    def __init__(self, app: Any) -> None:
        """Install flow control on *app* (idempotent)."""

    @classmethod
    def installed(cls, app: Any) -> FlowControl | None:
        """The FlowControl of *app*, or ``None`` if ``FlowControl(app)`` was never called."""
        return _INSTALLED.get(unproxy(app))

    # -- the engines ------------------------------------------------------------------------
    @property
    def settings(self) -> FlowControlSettings:
        """The app's ``flowcontrol_*`` settings, read once."""
        return self.engines.settings

    @property
    def backend(self) -> AdmissionBackend:
        """The admission backend (``flowcontrol_backend`` or ``flowcontrol_backend_url``)."""
        return self.engines.backend

    @property
    def store(self) -> ParkingStore:
        """The parking store (``flowcontrol_parking_url``)."""
        return self.engines.store

    @property
    def backend_is_local(self) -> bool:
        """True for the in-process backend: its state lives in one worker's main process."""
        return self.engines.backend_is_local

    @property
    def gate(self) -> Gate | None:
        """This worker instance's gate, in a worker's main process where flow control runs."""
        runtime = runtime_of(self.app)
        return runtime.gate if runtime is not None else None

    def in_worker_main(self) -> bool:
        """True in the main process of a worker whose flow control is running."""
        return in_worker_main(self.app)

    def call_backend(self, method: str, **kwargs: Any) -> Any:
        """Call an operator method of the backend (``release``, ``set_capacity``,
        ``set_max_hold``) from anywhere: directly when the backend is shared (Redis) or we
        are the worker that holds it, else through the workers' remote control
        (worker/backend_calls.py)."""
        return call_backend(self.app, method, **kwargs)

    def set_capacity(self, name: str, capacity: int | None) -> None:
        """Override queue *name*'s capacity (``None`` resets to its config)."""
        self.call_backend("set_capacity", name=name, capacity=capacity)

    def set_max_hold(self, name: str, seconds: float | str | None) -> None:
        """Override queue *name*'s max_hold for slots granted from now on (``None`` resets)."""
        self.call_backend("set_max_hold", name=name, seconds=seconds)

    # -- queues -----------------------------------------------------------------------------
    def register_queue(self, config: QueueConfig | dict[str, Any]) -> QueueConfig:
        """Register (or replace) a flow queue at run time, fleet-wide for a shared backend."""
        return self.engines.register_queue(config)

    def config_of(self, name: str) -> QueueConfig | None:
        """The config of queue *name* as this process knows it (asks the backend once)."""
        return self.engines.config_of(name)


def _check_settings(app: Any) -> None:
    """Validate *app*'s ``flowcontrol_*`` settings in every process that calls ``FlowControl(app)``:
    now if its configuration is loaded, else when Celery loads it (a worker's boot, a producer's
    first send), so ``FlowControl(app)`` may still come before ``config_from_object``.

    A callable given to ``app.add_defaults`` runs where Celery loads the configuration and
    what it raises reaches whoever read ``app.conf``; a receiver of ``on_after_configure``
    could not stop anything (Celery logs and drops what a receiver raises)."""

    def check() -> dict[str, Any]:
        settings = read_settings(app)  # afresh: the cached settings are made at first real use
        parking_url(settings.parking_url)  # a dialect SQLAlchemy lacks ("postgres://") too
        return {}

    app.add_defaults(check)


def register_queue(app: Any, config: QueueConfig | dict[str, Any]) -> QueueConfig:
    """Register (or replace) flow queue *config* on *app*'s backend at run time."""
    return FlowControl(app).register_queue(config)
