"""The e2e project of calls that collapse: :mod:`tests.support.projects.base` plus unique and debounced
tasks, and :func:`collapse_harness` to run it.

``proj.sync``      ``flow_unique=True``: records its run (``<prefix>:runs``: ``<id>|<account>|<node>``),
                   sleeps ``FCT_HOLD_SECONDS`` (long on a node about to die), returns the account
``proj.fails``     ``flow_unique`` by key callable, in the flow queue ``api``: raises ``ValueError``
``proj.reindex``   ``flow_debounce=1.0``, ``flow_debounce_max=6``: records ``<id>|<version>|<at>``
                   in ``<prefix>:reindexed`` and returns the version
``proj.flaky``     ``flow_unique=True``: retries once after 1 s, then returns the attempt count;
                   records ``<id>|<retries>`` in ``<prefix>:attempts``
``proj.stuck``     ``flow_unique=True, flow_unique_ttl=1.5``: sleeps 6 s (a run stuck past its TTL)
``proj.pushed``    ``flow_unique=True`` in the flow queue ``api``: its first run raises
                   ``FlowBackoff(1)`` (parked, run again), records ``<id>|<run>`` in ``pushed``
``proj.digest``    ``flow_debounce=0.5`` per tenant (``debounce_key``), in the flow queue ``api``
                   with ``flow_priority=3``: records ``<id>|<tenant>|<n>|<priority>`` in ``digests``
``proj.embed``     ``flow_batch`` size 5, wait 0.5 s, keyed by ``model``, in the flow queue ``api``:
                   records ``<batch id>|<model>|<call ids>`` in ``batches``; returns a dict by call
                   id (``text`` upper-cased), an exception for a text ``"bad"``, a wrong shape
                   for a text ``"shape"``
``proj.square``    ``flow_batch`` size 3, wait 0.3 s, no flow queue: returns a list of squares
``proj.double``    a plain FlowTask returning ``2 * n``; ``proj.doubles`` the same as a ``flow_batch``
                   of size 100, wait 0.5 s (the batch benchmark's pair); ``proj.lone``
                   ``flow_batch`` size 1000, wait 0.5 s: records its run's start in ``lone``
``proj.recompute`` ``flow_unique`` by board, ``flow_unique_keep="latest"``, acks late: records
                   ``<id>|<version>|<node>|start|<at>`` and ``...|end|<at>`` in ``recomputed``
                   and ``<id>|<at>`` in ``beats`` every 0.05 s of its ``hold`` seconds;
                   ``proj.recompute_gated`` the same in the flow queue ``api``
``proj.cb_doubles`` (when celery-batches is installed) the same as ``proj.doubles`` through
                   celery-batches (``Batches``, flush every 100 or 0.5 s): the benchmark's baseline
``proj.slowbatch`` ``flow_batch`` size 5, wait 0.3 s: records ``<batch id>|<node>|<call ids>`` in
                   ``slowbatches``, sleeps ``FCT_HOLD_SECONDS``, returns the calls' first arguments
``proj.pair``      ``flow_batch`` size 2, wait 60 s (a lone call gathers long enough to be looked
                   at): returns the calls' first arguments
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import redis
from celery import Celery

from celery_flowcontrol import BatchCall, FlowBackoff, FlowTask
from tests.support.harness import Harness
from tests.support.projects.base import create_app as create_base_app


def create_app(env: Mapping[str, str]) -> Celery:
    """The base e2e app with the collapse tasks above."""
    app = create_base_app(env)
    prefix = env["FCT_PREFIX"]
    url = env.get("FCT_GAUGE_URL", "redis://127.0.0.1:6379/0")
    clients: list[redis.Redis] = []

    def record(key: str, value: str) -> None:
        if not clients:  # one connection per process (pool children fork)
            clients.append(redis.Redis.from_url(url))
        clients[0].rpush(f"{prefix}:{key}", value)

    @app.task(name="proj.sync", shared=False, base=FlowTask, bind=True, flow_unique=True)
    def sync(self: FlowTask, account: int) -> int:
        record("runs", f"{self.request.id}|{account}|{os.environ.get('FCT_NODE', '')}")
        time.sleep(float(os.environ.get("FCT_HOLD_SECONDS", "0.3")))
        return account

    @app.task(name="proj.fails", shared=False, base=FlowTask, flow_queue="api",
              flow_unique=lambda args, kwargs: f"acct-{args[0]}")
    def fails(account: int) -> None:
        record("runs", f"fails|{account}")
        time.sleep(0.3)
        raise ValueError(f"account {account} is closed")

    @app.task(name="proj.reindex", shared=False, base=FlowTask, bind=True,
              flow_debounce=1.0, flow_debounce_max=6)
    def reindex(self: FlowTask, doc: str, version: int) -> int:
        record("reindexed", f"{self.request.id}|{version}|{time.time():.6f}")
        return version

    @app.task(name="proj.flaky", shared=False, base=FlowTask, bind=True, flow_unique=True,
              max_retries=2)
    def flaky(self: FlowTask, account: int) -> int:
        record("attempts", f"{self.request.id}|{self.request.retries}")
        if not self.request.retries:
            raise self.retry(countdown=1.0)
        return int(self.request.retries)

    @app.task(name="proj.stuck", shared=False, base=FlowTask, flow_unique=True,
              flow_unique_ttl=1.5)
    def stuck(account: int) -> int:
        time.sleep(6)
        return account

    @app.task(name="proj.pushed", shared=False, base=FlowTask, bind=True, flow_queue="api",
              flow_unique=True)
    def pushed(self: FlowTask, account: int) -> int:
        if not clients:
            clients.append(redis.Redis.from_url(url))
        run = int(clients[0].incr(f"{prefix}:pushed-runs"))
        record("pushed", f"{self.request.id}|{run}")
        if run == 1:
            raise FlowBackoff(1.0)  # the downstream said "not before 1 s"
        return run

    @app.task(name="proj.digest", shared=False, base=FlowTask, bind=True, flow_queue="api",
              flow_priority=3, flow_debounce=0.5, debounce_key=lambda args, kwargs: args[0])
    def digest(self: FlowTask, tenant: str, n: int) -> int:
        record("digests", f"{self.request.id}|{tenant}|{n}|{self.request.get('flow_slot')}")
        return n

    @app.task(name="proj.embed", shared=False, base=FlowTask, bind=True, flow_queue="api",
              flow_batch={"size": 5, "wait": 0.5, "key": lambda args, kwargs: kwargs["model"]})
    def embed(self: FlowTask, calls: list[BatchCall]) -> object:
        models = {c.kwargs["model"] for c in calls}
        record("batches", f"{self.request.id}|{','.join(sorted(models))}|"
                          f"{','.join(self.request.flow_batch)}")
        if any(c.kwargs["text"] == "shape" for c in calls):
            return ["too", "short"][: len(calls) - 1]
        return {c.id: (ValueError("bad text") if c.kwargs["text"] == "bad"
                       else c.kwargs["text"].upper()) for c in calls}

    @app.task(name="proj.square", shared=False, base=FlowTask, flow_batch={"size": 3, "wait": 0.3})
    def square(calls: list[BatchCall]) -> list[int]:
        return [c.args[0] ** 2 for c in calls]

    @app.task(name="proj.double", shared=False, base=FlowTask)
    def double(n: int) -> int:
        return 2 * n

    @app.task(name="proj.doubles", shared=False, base=FlowTask,
              flow_batch={"size": 100, "wait": 0.5})
    def doubles(calls: list[BatchCall]) -> list[int]:
        return [2 * c.args[0] for c in calls]

    @app.task(name="proj.lone", shared=False, base=FlowTask,
              flow_batch={"size": 1000, "wait": 0.5})
    def lone(calls: list[BatchCall]) -> list[None]:
        record("lone", f"{time.time():.6f}")
        return [None] * len(calls)

    @app.task(name="proj.slowbatch", shared=False, base=FlowTask, bind=True,
              flow_batch={"size": 5, "wait": 0.3})
    def slowbatch(self: FlowTask, calls: list[BatchCall]) -> list[int]:
        record("slowbatches", f"{self.request.id}|{os.environ.get('FCT_NODE', '')}|"
                              f"{','.join(c.id for c in calls)}")
        time.sleep(float(os.environ.get("FCT_HOLD_SECONDS", "0.1")))
        return [c.args[0] for c in calls]

    @app.task(name="proj.pair", shared=False, base=FlowTask, flow_batch={"size": 2, "wait": 60})
    def pair(calls: list[BatchCall]) -> list[int]:
        return [c.args[0] for c in calls]

    try:  # the benchmark's baseline (benchmarks/batches.py): celery-batches, when installed
        from celery_batches import Batches
    except ImportError:
        Batches = None
    if Batches is not None:
        @app.task(name="proj.cb_doubles", shared=False, base=Batches, flush_every=100,
                  flush_interval=0.5)
        def cb_doubles(requests: list) -> None:
            for r in requests:
                app.backend.mark_as_done(r.id, 2 * r.args[0], request=r)

    def recompute_run(task: FlowTask, board: str, version: int, hold: float) -> int:
        """Record the run's start, then a beat every 0.05 s while it runs, then its end."""
        me = f"{task.request.id}|{version}|{os.environ.get('FCT_NODE', '')}"
        record("recomputed", f"{me}|start|{time.time():.6f}")
        end = time.monotonic() + hold
        while time.monotonic() < end:
            record("beats", f"{task.request.id}|{time.time():.6f}")
            time.sleep(0.05)
        record("recomputed", f"{me}|end|{time.time():.6f}")
        return version

    @app.task(name="proj.recompute", shared=False, base=FlowTask, bind=True, acks_late=True,
              reject_on_worker_lost=True, flow_unique=lambda args, kwargs: args[0],
              flow_unique_keep="latest")
    def recompute(self: FlowTask, board: str, version: int, hold: float = 0.2) -> int:
        return recompute_run(self, board, version, hold)

    @app.task(name="proj.recompute_gated", shared=False, base=FlowTask, bind=True,
              flow_queue="api", flow_unique=lambda args, kwargs: args[0],
              flow_unique_keep="latest")
    def recompute_gated(self: FlowTask, board: str, version: int, hold: float = 0.2) -> int:
        return recompute_run(self, board, version, hold)

    return app


class CollapseHarness(Harness):
    """A :class:`Harness` whose workers and client app run this module's project."""

    project = "tests.support.projects.collapse"
