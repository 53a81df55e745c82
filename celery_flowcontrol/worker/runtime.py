"""The worker's runtime: flow control's parts in one worker instance, wired in one constructor.

:func:`install` (called by ``FlowControl(app)`` and by :class:`FlowControlStep` alike, once
per app) connects what a process of the app needs: the producer hook that stamps a FlowTask's
decorator defaults on tasks sent by name, the beat tasks, the remote-control command, the
stats provider and the ``worker_shutdown`` hook.

:class:`WorkerRuntime` is built by the consumer step on its first start, from the app's
:class:`~celery_flowcontrol.engines.Engines`: it registers the configured queues and builds the
gate, the waker, the lingering waiters, the re-asserter and the heartbeat watch, each handed what it
needs when it is made, and registers itself in runtime_registry.py, where the parts Celery builds for us
(strategy, request, remote control) find it.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
import weakref
from typing import Any

from celery import signals

from ..admission.base import Subscription
from ..engines import Engines, engines_of, unproxy
from ..parked_state import ParkedStates
from ..protocol import task_id_of
from ..room import check_room_of
from ..task import FlowTask, serial_config, stamp_headers
from .control import register_locator, register_stats_provider
from .gate import Gate
from .holdings import Holdings
from .ledger import Ledger
from .linger import Lingering
from .reassert import HeartbeatWatch, Reasserter
from .runtime_registry import forget, remember, runtime_of
from .waker import Waker

logger = logging.getLogger(__name__)

#: Worker settings without which a cap can be exceeded or a task lost (see docs/worker.md).
EXACT_SETTINGS = (("task_acks_late", True), ("worker_prefetch_multiplier", 1),
                  ("task_reject_on_worker_lost", True))

_INSTALLED: weakref.WeakSet[Any] = weakref.WeakSet()
_LOCK = threading.Lock()


class WorkerRuntime:
    """Flow control running in one worker instance (the main process of a ``celery worker``)."""

    def __init__(self, engines: Engines, hostname: str) -> None:
        self.engines = engines
        s = engines.settings
        backend = engines.backend
        serial = [serial_config(t.name) for t in engines.app.tasks.values()
                  if isinstance(t, FlowTask) and t.serial]
        configured = (*s.queues, *serial)
        for config in configured:
            engines.register_queue(config)
        self.instance = instance = f"{hostname}/{os.getpid()}/{uuid.uuid4().hex[:6]}"
        self.pid = os.getpid()
        clock = engines.clock  # one clock for every part (engines.py)
        ledger = Ledger(clock)
        # Where this instance holds slots or waits: the queues its sweeps read (holdings.py).
        holdings = Holdings(ledger, horizon=s.waiter_ttl + s.grant_ttl)
        # A lingering waiter handed its grant brings the next parked ones closer (the waker's).
        lingering = Lingering(s.linger, on_handed=lambda queue: waker.prewake(queue))
        reasserter = Reasserter(backend=backend, instance=instance, ledger=ledger,
                                configured=configured, config_of=engines.config_of,
                                holdings=holdings)
        waker = Waker(app=engines.app, backend=backend, store=engines.store, instance=instance,
                      heartbeat_every=s.instance_ttl / 3, reclaim_every=s.reclaim_interval,
                      clock=clock, lingering=lingering, reassert=reasserter, holdings=holdings)
        gate = Gate(backend=backend, store=engines.store, waker=waker, instance=instance,
                    configs=engines.config_of, clock=clock, lingering=lingering, ledger=ledger,
                    states=ParkedStates(engines.app, enabled=s.track_parked))
        self.gate = gate
        self.waker = waker
        self.watch = HeartbeatWatch(reasserter, s.instance_ttl / 3)
        self._subscription: Subscription | None = None

    def start(self) -> None:
        """Subscribe to grants, start the waker and the heartbeat watch (no heartbeat yet:
        nothing is held, and an admission leases its holder itself)."""
        backend = self.engines.backend
        self._subscription = backend.subscribe_grants(self.waker.on_grant)
        self.waker.start()
        self.watch.start()
        _warn_inexact(self.engines.app)
        logger.info("flowcontrol: instance %s admits through %s, parks in %s", self.instance,
                    type(backend).__name__, self.engines.store)

    def stop(self) -> None:
        """Release what was admitted but never finished; stop the threads."""
        self.gate.close()
        self.watch.stop()
        if self._subscription is not None:
            self._subscription.close()
        self.waker.stop()


def install(app: Any) -> None:
    """Connect flow control's hooks for *app* in this process (idempotent; module docstring)."""
    app = unproxy(app)
    with _LOCK:
        if app in _INSTALLED:
            return
        _INSTALLED.add(app)
    # A uid per app: Celery before 5.7 keys a receiver by its function alone.
    uid = f"flowcontrol-{id(app)}"

    def stamp(sender: Any = None, headers: dict[str, Any] | None = None, **kwargs: Any) -> None:
        stamp_headers(app, sender, headers)

    def shutdown(sender: Any = None, **kwargs: Any) -> None:
        if getattr(sender, "app", None) is app:
            stop_runtime(app)

    signals.before_task_publish.connect(stamp, weak=False, dispatch_uid=f"{uid}-stamp")
    signals.worker_shutdown.connect(shutdown, weak=False, dispatch_uid=f"{uid}-shutdown")
    from .. import beat
    from . import remote  # noqa: F401 - registers the flowcontrol_call command

    check_room_of(app)  # apply_async refuses what a full waiting bound would (room.py)
    register_stats_provider("admission", _admission_stats)
    register_locator(_where)
    beat.register_tasks(app)
    from ..collapse.landing import install_collapse

    install_collapse(app)  # flow_unique / flow_debounce: their signals and task (collapse/)


def installed(app: Any) -> bool:
    """True once :func:`install` ran for *app* in this process."""
    return unproxy(app) in _INSTALLED


def start_runtime(app: Any, hostname: str) -> WorkerRuntime:
    """The runtime of this worker instance: built and started on the first call."""
    app = unproxy(app)
    with _LOCK:
        runtime: WorkerRuntime | None = runtime_of(app)
        if runtime is None:
            runtime = WorkerRuntime(engines_of(app), hostname)
            remember(app, runtime)
            runtime.start()
    return runtime


def stop_runtime(app: Any) -> None:
    """Stop the runtime of *app* in this process, if one runs."""
    runtime = forget(unproxy(app))
    if runtime is not None:
        runtime.stop()


def _where(state: Any, task_id: str) -> dict[str, Any] | None:
    """Where this worker instance has *task_id* (lingering, or admitted), for the remote
    control command ``flowcontrol_where``; ``None`` if it has not."""
    app = getattr(getattr(state, "consumer", None), "app", None)
    runtime = runtime_of(app) if app is not None else None
    if runtime is None:
        return None
    gate = runtime.gate
    for ticket, queue in gate.lingering.lingering().items():
        if task_id_of(ticket) == task_id:
            return {"where": "lingering", "queue": queue, "instance": runtime.instance}
    for (tid, _tag), admission in gate.ledger.items():
        if tid == task_id:  # admitted here: running, or about to
            queue = next((e.slot.queue for e in admission.entries
                          if e.slot.slot_id == admission.primary), None)
            return {"where": "running", "queue": queue, "slot": admission.primary,
                    "instance": runtime.instance}
    return None


def _admission_stats(state: Any) -> dict[str, Any] | None:
    """This worker instance's admission figures, for ``inspect flowcontrol_stats``."""
    app = getattr(getattr(state, "consumer", None), "app", None)
    runtime = runtime_of(app) if app is not None else None
    return runtime.gate.stats() if runtime is not None else None


def _warn_inexact(app: Any) -> None:
    if not any(isinstance(t, FlowTask) for t in app.tasks.values()):
        return
    conf = app.conf
    off = [f"{k}={conf.get(k)!r}" for k, want in EXACT_SETTINGS if conf.get(k) != want]
    if off:
        logger.warning(
            "flowcontrol: caps are exact only with task_acks_late=True, "
            "worker_prefetch_multiplier=1 and task_reject_on_worker_lost=True; this worker "
            "has %s (see docs/worker.md)", ", ".join(off))
