"""The consumer bootstep: starts flow control inside a worker.

It reaches flow control through the worker's runtime alone (runtime.py). When the worker
builds it, before any connection to the broker, :func:`~.runtime.prepare` installs flow
control's hooks and makes sure of its services (a parking URL that loads, the parking tables,
an admission backend that answers). On the first start it builds the worker instance's runtime
(the gate, the waker thread, the grant subscription); on every start (also after a broker
reconnect) the runtime attaches to the consumer (:meth:`~.runtime.WorkerRuntime.attach`), and
on every stop detaches from it. The runtime itself is stopped on ``worker_shutdown``, after
the pool has finished, releasing what was admitted but never finished.
"""

from __future__ import annotations

from typing import Any

from celery import bootsteps

from .runtime import WorkerRuntime, prepare, start_runtime


class FlowControlStep(bootsteps.StartStopStep):
    """The consumer step of flow control. :class:`~celery_flowcontrol.FlowControl` adds it;
    Celery's own way to add a step works as well, with the ``flowcontrol_*`` settings in
    ``app.conf``::

        app.steps["consumer"].add(FlowControlStep)

    It installs flow control's hooks when it is built, before any consumer step starts, so
    the task strategies Celery builds next already gate.
    """

    label = "FlowControl"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        prepare(c.app)
        self._runtime: WorkerRuntime | None = None

    def start(self, c: Any) -> None:
        self._runtime = start_runtime(c.app, c.hostname)
        self._runtime.attach(c)

    def stop(self, c: Any) -> None:
        if self._runtime is not None:
            self._runtime.detach()

    def shutdown(self, c: Any) -> None:
        # The runtime outlives the consumer: tasks still running in the pool release their
        # slots as they finish; it is stopped on ``worker_shutdown``.
        self.stop(c)
