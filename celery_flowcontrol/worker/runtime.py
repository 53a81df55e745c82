"""The worker's runtime: flow control's parts in one worker instance, wired in one constructor.

:func:`install` (called by ``FlowControl(app)`` and by :class:`FlowControlStep` alike, once
per app) connects what a process of the app needs: the producer hook that stamps a FlowTask's
decorator defaults on tasks sent by name, the beat tasks, the remote-control command, the
stats provider and the ``worker_shutdown`` hook.

:class:`WorkerRuntime` is built by the consumer step on its first start, from the app's
:class:`~celery_flowcontrol.engines.Engines`: it registers the configured queues and builds the
waker, the lingering waiters, the re-asserter, the heartbeat watch, the one quarantine of every
dead letter, and the gate with the parts it decides with (:func:`build_gate`: the gate builds
none), each handed what it needs when it is made, and registers itself in runtime_registry.py,
where the parts Celery builds for us (strategy, request, remote control) find it. The consumer
step reaches flow control through the runtime alone: :func:`prepare` when it is built,
:meth:`WorkerRuntime.attach` on every consumer start and :meth:`WorkerRuntime.detach` on its
stop.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from celery import signals

from ..admission.base import AdmissionBackend, Subscription
from ..config import QueueConfig
from ..engines import Engines, engines_of, unproxy
from ..kombu_redis import BrokerLists
from ..parked_state import ParkedStates
from ..parking import ParkingStore
from ..protocol import task_id_of
from ..room import check_room_of
from ..task import FlowTask, serial_config, stamp_headers
from . import early
from .admitter import Admitter
from .asking import LoopAsks
from .consumer_loop import ConsumerLoop
from .control import register_locator, register_stats_provider
from .delivery import Outage
from .drain import Drainer, Floods
from .gate import Gate
from .holdings import Holdings
from .ledger import Ledger
from .linger import Lingering
from .park import Parker
from .parkbatch import ParkBatch
from .quarantine import Quarantine
from .reassert import HeartbeatWatch, Reasserter
from .refusal import Refusals
from .release import Releaser
from .runtime_registry import forget, remember, runtime_of
from .startup import check_at_boot
from .twins import Twins
from .wake_ahead import WakeAhead
from .wake_items import inbox
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
        # A lingering waiter handed its grant brings the next parked ones closer: the
        # wake-ahead policy puts that in the waker's inbox (wake_ahead.py, wake_items.py).
        ahead = WakeAhead(store=engines.store, backend=backend, inbox=inbox())
        lingering = Lingering(s.linger, ahead=ahead)
        reasserter = Reasserter(backend=backend, instance=instance, ledger=ledger,
                                configured=configured, config_of=engines.config_of,
                                holdings=holdings)
        # Every dead letter, the parker's and the waker's alike (quarantine.py).
        quarantine = Quarantine(engines.store, backend)
        waker = Waker(app=engines.app, backend=backend, store=engines.store, instance=instance,
                      heartbeat_every=s.instance_ttl / 3, reclaim_every=s.reclaim_interval,
                      clock=clock, lingering=lingering, reassert=reasserter, holdings=holdings,
                      ahead=ahead, quarantine=quarantine)
        # Which queues' denials are parked: told by the batches, read by the drainer.
        floods = Floods()
        gate = build_gate(backend=backend, store=engines.store, waker=waker, instance=instance,
                          configs=engines.config_of, clock=clock, lingering=lingering,
                          ledger=ledger, states=ParkedStates(engines.app, enabled=s.track_parked),
                          quarantine=quarantine, floods=floods)
        #: A flooded queue's backlog taken out of the broker in bulk (drain.py).
        self.drainer = Drainer(floods=floods, tasks=engines.app.tasks, backend=backend,
                               store=engines.store, parker=gate.parker, releases=gate.releaser,
                               ledger=ledger, lingering=lingering, configs=engines.config_of,
                               instance=instance, clock=clock)
        self.gate = gate
        self.waker = waker
        self.lingering = lingering
        #: What the parts Celery builds reach (request.py, backoff.py, strategy.py): the
        #: releaser, the ledger and the parker. The gate itself only decides.
        self.releaser = gate.releaser
        self.ledger = ledger
        self.parker = gate.parker
        #: What the consumer's loop runs (attach): the calls asked on it, the parks batched on it.
        self.asks = gate.asks
        self.batch = gate.batch
        self.watch = HeartbeatWatch(reasserter, s.instance_ttl / 3)
        self._subscription: Subscription | None = None
        self._timers: list[Any] = []
        self._unhook: Any = None

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

    def attach(self, consumer: Any) -> None:
        """Work with *consumer* (Celery's, on each of its starts: also after a broker
        reconnect): the waker's tick on its timer (the heartbeat, the poll and the chores run
        from there), waiters lingering in its prefetch window (linger.py), admission calls
        answered on its event loop (admission/redis/loop.py), sent before kombu's own round
        trip for their message where the transport makes one (early.py), and its denials
        parked in batches (parkbatch.py)."""
        self.detach()
        c = consumer
        # Again after a reconnect: what Consumer.on_close dropped unrun gives its slots back.
        self.releaser.finish_dropped(c.pool)
        interval = self.engines.settings.poll_interval
        self._timers = [c.timer.call_repeatedly(interval, self.waker.tick, priority=5)]
        self.waker.tick()
        hub = getattr(c, "hub", None)
        qos = getattr(c, "qos", None)
        # At most a prefetch window of lingerers, each raising the window by one (linger.py).
        self.lingering.attach(hub, c.timer, getattr(c, "initial_prefetch_count", 0) or 0, qos)
        if hub is not None:
            self.asks.attach(hub)
            self.batch.attach(hub, qos)
            if self.asks.attached:
                self._unhook = early.hook(c, self.asks)
        tasks = getattr(c, "task_consumer", None)
        if tasks is not None and hub is not None and self.engines.settings.bulk_drain:
            # Opt-in: a bulk admitted beside the consumer's own asks may take its turn in the
            # line before a message the consumer fetched first (docs/worker.md, "A flood").
            self.drainer.attach(BrokerLists.of(tasks.channel, [q.name for q in tasks.queues]))

    def detach(self) -> None:
        """The consumer stopped: its timers are cancelled, the calls taken off its loop, and
        the waiters lingering in it and the parks waiting for a batch forgotten (unacked, they
        go back to the broker with the channel). The gate outlives the consumer: tasks still
        running in the pool release their slots as they finish."""
        for entry in self._timers:
            entry.cancel()
        self._timers = []
        self.drainer.detach()  # its batch in hand parked or given back first
        self.lingering.detach()
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        self.batch.detach()
        self.asks.detach()

    def stats(self) -> dict[str, Any]:
        """This instance's admission figures: the gate's decisions, the waker's wakes and the
        waiters lingering here."""
        lingering = self.lingering
        return {**self.gate.stats(), "woken": self.waker.woken, "waiting_here": len(lingering),
                "handed_over": lingering.handed, "drained": self.drainer.drained}

    def stop(self) -> None:
        """Release what was admitted but never finished; stop the threads."""
        self.drainer.close()
        self.gate.close()
        self.watch.stop()
        if self._subscription is not None:
            self._subscription.close()
        self.waker.stop()


def build_gate(*, backend: AdmissionBackend, store: ParkingStore, waker: Waker, instance: str,
               configs: Callable[[str], QueueConfig | None],
               clock: Callable[[], float] = time.time, lingering: Lingering | None = None,
               ledger: Ledger | None = None, states: ParkedStates | None = None,
               quarantine: Quarantine | None = None, floods: Floods | None = None) -> Gate:
    """A gate of *instance* and the parts it decides with, each built here and handed what it
    needs: the parker (parks, and every dead letter through *quarantine*: by default the
    waker's, so one per worker), the consumer's loop with the calls asked and the releases sent
    on it, the batch of parks, the refusals and the waiting admission call. The gate builds
    none of them (it only decides); each reply asked on the loop comes back to it."""
    ledger = ledger if ledger is not None else Ledger()
    outage = Outage()  # one outage, seen by the gate and by the batch that parks on the loop
    parker = Parker(store=store, backend=backend, wakes=waker, clock=clock, states=states,
                    quarantine=quarantine if quarantine is not None else waker.quarantine)
    # The consumer's event loop, while attached: admission calls and releases sent on it.
    loop = ConsumerLoop(backend)
    releaser = Releaser(backend=backend, ledger=ledger, retries=waker, loop=loop)
    asks = LoopAsks(backend=backend, instance=instance, ledger=ledger, clock=clock, loop=loop,
                    releases=releaser)
    gate = Gate(backend=backend, store=store, instance=instance, configs=configs, clock=clock,
                lingering=lingering if lingering is not None else Lingering(0.0), ledger=ledger,
                outage=outage, parker=parker, asks=asks, releaser=releaser,
                batch=ParkBatch(store=store, parker=parker, clock=clock, outage=outage,
                                floods=floods),
                refusals=Refusals(releaser),
                admitter=Admitter(backend=backend, instance=instance, ledger=ledger,
                                  configs=configs),
                twins=Twins())
    asks.answer_to(gate)
    return gate


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


def prepare(app: Any) -> None:
    """What the consumer step does when it is built, before any consumer step starts:
    :func:`install` (idempotent: ``FlowControl(app)`` may have done it), so the task
    strategies Celery builds next already gate, and the services' checks (startup.py), made
    before the consumer connects, so that while a check waits the worker holds no message."""
    install(app)
    check_at_boot(engines_of(app))


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
    for ticket, queue in runtime.lingering.lingering().items():
        if task_id_of(ticket) == task_id:
            return {"where": "lingering", "queue": queue, "instance": runtime.instance}
    for (tid, _tag), admission in runtime.ledger.items():
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
    return runtime.stats() if runtime is not None else None


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
