"""The Celery project every e2e test runs: one app factory, configured from environment variables.

The harness writes a two-line ``proj.py`` into the test's tmp dir (``app = create_app(os.environ)``)
and starts ``celery -A proj worker`` there; the test process builds its own client app from the
same mapping. Variables:

``FCT_BROKER_URL``     broker (redis://, amqp://, filesystem://)
``FCT_RESULT_BACKEND`` result backend (optional; results are not needed, the gauge counts)
``FCT_PREFIX``         unique per test: broker queue name, kombu key prefix, flowcontrol key prefix
``FCT_GAUGE_URL``      Redis URL of the gauge (:mod:`tests.support.gauge`)
``FCT_FLOW``           ``1``: ``FlowControl(app)`` and ``base=FlowTask``; ``0``: plain Celery
``FCT_CONF``           JSON object merged into ``app.conf`` last (``flowcontrol_queues`` and so on;
                       its ``broker_transport_options`` over :func:`broker_options`)
``FCT_HOLD_SECONDS``   how long ``proj.hold`` sleeps on this node (the kill -9 test's victim)
``FCT_NODE``           this node's name, written into the gauge's start records
``FCT_BEAT_EVERY``     seconds: merge ``beat_schedule()`` with both tasks at this period
``FCT_WITNESS``        ``1``: count the runs admission let in, per flow queue (:func:`witness_admissions`)
``FCT_INSTALL``        ``step``: install with ``app.steps["consumer"].add(FlowControlStep)`` alone,
                       not ``FlowControl(app)`` (Celery's own way to add an extension's step)

Every node records ``task_revoked`` in the gauge's Redis (:func:`revocations`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from celery import Celery, Task, signals

from tests.support.gauge import Gauge

#: The settings that make admission exact (docs/worker.md says why).
EXACT = {"task_acks_late": True, "worker_prefetch_multiplier": 1, "task_reject_on_worker_lost": True}


def broker_options(broker_url: str, prefix: str) -> dict[str, Any]:
    """Transport options that keep one test's broker keys apart from every other test's."""
    if broker_url.startswith("redis"):
        # Every kombu key (queues, bindings, the unacked hash) under the test's prefix; a short
        # visibility timeout so a message of a killed node comes back within the test, looked
        # for on every sweep (kombu otherwise scans on one sweep in ten: up to 20 s late). The
        # sweep's lock, left behind by a node killed inside a sweep, stops the others' sweeps
        # for its expiry (kombu's default: 5 minutes); a sweep takes milliseconds.
        return {"global_keyprefix": f"{prefix}:", "visibility_timeout": 20, "unacked_restore_interval": 2,
                "unacked_restore_throttle": 1, "unacked_mutex_expire": 10}
    return {}


def base_app(env: Mapping[str, str], **conf: Any) -> Celery:
    """A Celery app of one test's world, no task yet: its broker and result backend, its queue,
    kombu keys and flowcontrol key prefix, :data:`EXACT`, *conf*, then ``FCT_CONF``."""
    prefix = env["FCT_PREFIX"]
    broker_url = env["FCT_BROKER_URL"]
    app = Celery("proj", broker=broker_url, backend=env.get("FCT_RESULT_BACKEND") or None)
    app.conf.update(
        EXACT,
        task_default_queue=f"{prefix}.tasks",
        broker_transport_options=broker_options(broker_url, prefix),
        result_backend_transport_options={"global_keyprefix": f"{prefix}:"},
        task_ignore_result=not env.get("FCT_RESULT_BACKEND"),
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=True,
        flowcontrol_key_prefix=prefix,
        **conf,
    )
    extra = json.loads(env.get("FCT_CONF") or "{}")
    # A test's own transport options (a shorter visibility_timeout) go over the ones that
    # keep its keys apart, never in their place.
    extra["broker_transport_options"] = {**app.conf.broker_transport_options,
                                         **extra.get("broker_transport_options", {})}
    app.conf.update(extra)
    if env.get("FCT_WITNESS") == "1":
        witness_admissions(app, Gauge(env.get("FCT_GAUGE_URL", "redis://127.0.0.1:6379/0"), prefix))
    return app


def witness_admissions(app: Celery, gauge: Gauge) -> None:
    """Count every run of *app* that admission let in, per flow queue (``Gauge.gated``): a test
    that measures a flow queue checks its runs were admitted there (the ``gated`` marker), not
    merely run by a pool that happened to be small. Only for such tests: one more Redis call per
    run would skew the throughput benchmark's gated side."""

    @signals.task_prerun.connect(weak=False)
    def witness(sender: Any = None, task: Any = None, **kwargs: Any) -> None:
        if getattr(task, "app", None) is app:
            gauge.admitted_in(task)


def create_app(env: Mapping[str, str]) -> Celery:
    """The app of one test, with the tasks ``proj.work``, ``proj.gate``, ``proj.hold``, ``proj.noop``
    (FlowTasks when ``FCT_FLOW=1``) and ``proj.plain_work``, ``proj.plain_noop`` (always plain)."""
    prefix = env["FCT_PREFIX"]
    flow = env.get("FCT_FLOW", "1") == "1"
    app = base_app(env)
    gauge = Gauge(env.get("FCT_GAUGE_URL", "redis://127.0.0.1:6379/0"), prefix)
    base: type[Task] = Task
    if flow:
        from celery_flowcontrol import FlowControl, FlowControlStep, FlowTask, beat_schedule

        if env.get("FCT_INSTALL") == "step":
            app.steps["consumer"].add(FlowControlStep)
        else:
            FlowControl(app)
        base = FlowTask
        if env.get("FCT_BEAT_EVERY"):
            every = float(env["FCT_BEAT_EVERY"])
            app.conf.beat_schedule = beat_schedule(reclaim_every=every, wake_due_every=every)

    @signals.task_revoked.connect(weak=False)
    def revoked(sender: Any = None, request: Any = None, expired: bool = False,
                terminated: bool = False, **kwargs: Any) -> None:
        if request is not None and getattr(sender, "app", None) is app:
            gauge.client.rpush(gauge.key("revoked"), json.dumps(
                {"id": request.id, "expired": bool(expired), "terminated": bool(terminated)}))

    @app.task(name="proj.work", shared=False, base=base, bind=True)
    def work(self: Task, label: str, seconds: float = 0.0) -> str:
        """Run for ``seconds``, measured by the gauge (and the instant admission let it in)."""
        admitted = getattr(self.request, "flow_admitted_at", None)
        if admitted is not None:
            gauge.client.rpush(gauge.key("admitted"), f"{admitted:.6f}")
        with gauge.measured(label):
            if seconds:
                time.sleep(seconds)
        return label

    @app.task(name="proj.gate", shared=False, base=base, bind=True)
    def gate(self: Task, label: str, timeout: float = 45.0) -> str:
        """Hold a slot until the test opens the gate (or ``timeout`` passes)."""
        with gauge.measured(label):
            deadline = time.monotonic() + timeout
            while not gauge.gate_open() and time.monotonic() < deadline:
                time.sleep(0.01)
        return label

    @app.task(name="proj.hold", shared=False, base=base, bind=True)
    def hold(self: Task, label: str) -> str:
        """Sleep as long as this node's ``FCT_HOLD_SECONDS`` says (long on a node about to die)."""
        with gauge.measured(label):
            time.sleep(float(os.environ.get("FCT_HOLD_SECONDS", "0.05")))
        return label

    @app.task(name="proj.retry_once", shared=False, base=base, bind=True, max_retries=3)
    def retry_once(self: Task, label: str) -> int:
        """Retry once with a countdown and an expiry (parked until its ETA), then succeed."""
        if not self.request.retries:
            raise self.retry(countdown=0.1, expires=60)
        with gauge.measured(label):
            return int(self.request.retries)

    @app.task(name="proj.plain_work", shared=False)
    def plain_work(label: str, seconds: float = 0.0) -> str:
        """``proj.work`` on the plain Task base, gated or not: the plain tasks of a mixed queue."""
        with gauge.measured(label):
            if seconds:
                time.sleep(seconds)
        return label

    @app.task(name="proj.noop", shared=False, base=base)
    def noop() -> None:
        """Nothing: the throughput benchmark's task."""

    @app.task(name="proj.plain_noop", shared=False)
    def plain_noop() -> None:
        """Nothing, on the plain Task base: the throughput baseline."""

    return app


def revocations(gauge: Gauge) -> dict[str, dict[str, bool]]:
    """``task_revoked`` as the nodes saw it: task id -> ``{"expired": ..., "terminated": ...}``."""
    out = {}
    for raw in gauge.client.lrange(gauge.key("revoked"), 0, -1):
        record = json.loads(raw)
        out[record.pop("id")] = record
    return out
