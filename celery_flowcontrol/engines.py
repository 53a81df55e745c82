"""The engines of one app's flow control, built from its settings: what every other part uses.

:func:`engines_of` gives each Celery app one :class:`Engines`: its settings (read once), its
admission backend (``flowcontrol_backend`` or ``flowcontrol_backend_url``), its parking store
(``flowcontrol_parking_url``) and the configs of its flow queues. The worker (its runtime), the
beat tasks and the facade all take them from here, so none of them needs another to reach the
engines; nothing is built before it is first used.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from functools import cached_property
from typing import Any

from .admission import backend_from_url
from .admission.base import AdmissionBackend
from .admission.memory import MemoryBackend
from .config import QueueConfig
from .parking import ParkingStore
from .settings import FlowControlSettings, get_settings

__all__ = ["Engines", "engines_of", "unproxy"]

_ENGINES: weakref.WeakKeyDictionary[Any, Engines] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


class Engines:
    """Settings, admission backend, parking store and queue configs of one app (lazily)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._configs: dict[str, QueueConfig] = {}

    @cached_property
    def settings(self) -> FlowControlSettings:
        """The app's ``flowcontrol_*`` settings, read once."""
        return get_settings(self.app)

    @cached_property
    def backend(self) -> AdmissionBackend:
        """The admission backend (``flowcontrol_backend`` or ``flowcontrol_backend_url``)."""
        s = self.settings
        if s.backend is not None:
            return s.backend() if callable(s.backend) and not isinstance(
                s.backend, AdmissionBackend) else s.backend
        return backend_from_url(s.backend_url, s.backend_options, key_prefix=s.key_prefix,
                                instance_ttl=s.instance_ttl, grant_ttl=s.grant_ttl,
                                waiter_ttl=s.waiter_ttl)

    @cached_property
    def store(self) -> ParkingStore:
        """The parking store (``flowcontrol_parking_url``), on :attr:`clock`."""
        return ParkingStore(self.settings.parking_url, clock=self.now)

    @cached_property
    def clock(self) -> Callable[[], float]:
        """The clock of this app's flow control: the ready backend's own, else ``time.time``
        (a backend built from a URL runs on ``time.time``, or Redis ``TIME``)."""
        if self.settings.backend is None:
            return time.time
        clock = getattr(self.backend, "clock", None)
        return clock if callable(clock) else time.time

    def now(self) -> float:
        """Now, by :attr:`clock` (a method, so that the store can take it before the
        backend is built)."""
        return self.clock()

    @property
    def backend_is_local(self) -> bool:
        """True for the in-process backend: its state lives in one worker's main process."""
        s = self.settings
        if s.backend is None:
            return s.backend_url.partition("://")[0].lower() == "memory"
        return isinstance(self.backend, MemoryBackend)  # a ready backend, or what one built

    def register_queue(self, config: QueueConfig | dict[str, Any]) -> QueueConfig:
        """Register (or replace) a flow queue on the backend, and remember its config."""
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


def engines_of(app: Any) -> Engines:
    """The :class:`Engines` of *app* (one per app, made on first use)."""
    app = unproxy(app)
    engines = _ENGINES.get(app)
    if engines is None:
        with _LOCK:
            engines = _ENGINES.setdefault(app, Engines(app))
    return engines


def unproxy(app: Any) -> Any:
    """The app behind ``celery.current_app`` (a proxy can't key a weak dictionary)."""
    getter = getattr(app, "_get_current_object", None)
    return getter() if callable(getter) else app
