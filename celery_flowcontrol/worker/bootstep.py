"""The consumer bootstep: starts flow control inside a worker.

When the worker builds it, before any connection to the broker, it makes sure of its services
(startup.py): a parking URL that loads, the parking tables (waiting for ``flowcontrol migrate``
if they are missing), an admission backend that answers (retried with backoff). On the first
start it builds the worker instance's runtime (runtime.py: the gate, the waker
thread, the grant subscription) and registers the configured flow queues. On every start
(also after a broker reconnect) it puts the waker's tick on the consumer's timer: the
instance heartbeat, the wake poller and the periodic chores run from there; and it lets the
gate let waiters linger in this consumer's prefetch window (linger.py) and send its admission calls
on the consumer's event loop (admission/redis/loop.py), each sent before kombu's own round trip for its
message where the transport makes one (early.py). On shutdown it stops its timers, takes the
calls off the loop and forgets the lingering waiters (unacked, they go back to the broker with the
channel);
the gate is closed on ``worker_shutdown``, after the pool has finished, releasing what was
admitted but never finished.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from ..engines import engines_of
from . import early
from .runtime import install, start_runtime
from .startup import check_at_boot

logger = logging.getLogger(__name__)


class FlowControlStep(bootsteps.StartStopStep):
    """The consumer step of flow control. :class:`~celery_flowcontrol.FlowControl` adds it;
    Celery's own way to add a step works as well, with the ``flowcontrol_*`` settings in
    ``app.conf``::

        app.steps["consumer"].add(FlowControlStep)

    It installs flow control's hooks (runtime.py's :func:`install`) when it is built, before
    any consumer step starts, so the task strategies Celery builds next already gate.
    """

    label = "FlowControl"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        install(c.app)  # idempotent: FlowControl(app) may have done it already
        # Before the consumer connects: while a check waits, the worker holds no message.
        check_at_boot(engines_of(c.app))
        self._timers: list[Any] = []
        self._lingering: Any = None
        self._gate: Any = None
        self._unhook: Any = None

    def start(self, c: Any) -> None:
        runtime = start_runtime(c.app, c.hostname)
        gate = runtime.gate
        # Again after a reconnect: what Consumer.on_close dropped unrun gives its slots back.
        gate.finish_dropped(c.pool)
        waker = gate.waker
        interval = runtime.engines.settings.poll_interval
        self._timers = [c.timer.call_repeatedly(interval, waker.tick, priority=5)]
        waker.tick()
        hub = getattr(c, "hub", None)
        # At most a prefetch window of lingerers, each raising the window by one (linger.py).
        gate.lingering.attach(hub, c.timer, getattr(c, "initial_prefetch_count", 0) or 0,
                              getattr(c, "qos", None))
        self._lingering = gate.lingering
        if hub is not None:  # admission calls answered on the consumer's loop (admission/redis/loop.py)
            gate.asks.attach(hub)
            # and its denials parked in batches (parkbatch.py)
            gate.batch.attach(hub, getattr(c, "qos", None))
            self._gate = gate
            if gate.asks.attached:  # and sent before kombu's own round trip (early.py)
                self._unhook = early.hook(c, gate.asks.ask_early)

    def stop(self, c: Any) -> None:
        for entry in self._timers:
            entry.cancel()
        self._timers = []
        if self._lingering is not None:
            self._lingering.detach()
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        if self._gate is not None:
            self._gate.batch.detach()
            self._gate.asks.detach()
            self._gate = None

    def shutdown(self, c: Any) -> None:
        # The gate outlives the consumer: tasks still running in the pool release their
        # slots as they finish; the runtime closes it on ``worker_shutdown``.
        self.stop(c)
