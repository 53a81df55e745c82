"""What compat.py reads past Celery's and kombu's public API is still there, on the installed
releases, and still means what its callers rely on.

Real pools and a real filesystem channel, started in this process; nothing is mocked but the
wire of one py-amqp channel with no broker (the confirmed publish's bound).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import gevent  # noqa: F401  in the test extra: a missing one fails the run, never skips it
import pytest
from celery import Celery
from celery.concurrency.gevent import TaskPool as GeventPool
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.thread import TaskPool as ThreadPool
from kombu import Connection
from kombu.exceptions import ChannelError

from celery_flowcontrol.compat import confirming, exchange_table, pool_size, publish_first, resized, unaccepted_jobs
from celery_flowcontrol.worker.message import woken_priority


def test_a_gevent_pool_has_the_size_it_was_grown_and_shrunk_to() -> None:
    pool = GeventPool(limit=2)
    pool.start()
    try:
        assert pool_size(pool) == 2  # not 0: nothing runs yet
        pool.grow(3)
        assert pool_size(pool) == 5
        resized(pool)
        assert pool.info["max-concurrency"] == 5  # what `celery inspect stats` shows
        pool.shrink(2)
        assert pool_size(pool) == 3
        resized(pool)
        assert pool.info["max-concurrency"] == 3
    finally:
        pool.stop()


def test_other_pools_have_their_own_num_processes() -> None:
    pool = ThreadPool(limit=3)
    pool.start()
    try:
        assert pool_size(pool) == pool.num_processes == 3
    finally:
        pool.stop()


def sleep_a_little() -> float:
    time.sleep(0.3)
    return 0.3


def test_a_prefork_job_counts_as_unaccepted_until_a_child_takes_it() -> None:
    # What a worker gives its pool: the child sets the app up before it takes jobs.
    pool = PreforkPool(limit=1, initargs=(Celery("t", set_as_current=False), "compat@test"))
    pool.start()
    try:
        assert unaccepted_jobs(pool) is False
        result = pool.apply_async(sleep_a_little)
        # billiard's result: accepted once the child has started it.
        job = next(iter(pool._pool._cache.values()))
        assert hasattr(job, "_accepted")
        deadline = time.monotonic() + 20
        while not job._accepted and time.monotonic() < deadline:
            assert unaccepted_jobs(pool) is True
            time.sleep(0.01)
        assert job._accepted, "the child never accepted the job"
        assert unaccepted_jobs(pool) is False
        del result
    finally:
        pool.stop()
        pool.terminate()


def test_a_filesystem_exchange_table_is_where_kombu_reads_it(tmp_path: Path) -> None:
    opts = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path),
            "control_folder": str(tmp_path / "control")}
    with Connection("filesystem://", transport_options=opts) as conn:
        channel = conn.default_channel
        table = exchange_table(channel, "fc.tasks")
        assert table.parent == tmp_path / "control"
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text('[["fc.tasks", "", "fc.tasks"]]')
        # kombu reads its bindings from that very file.
        assert [tuple(q) for q in channel.get_table("fc.tasks")] == [("fc.tasks", "", "fc.tasks")]


def test_a_name_that_would_leave_the_control_folder_is_refused_where_kombu_refuses_it(tmp_path: Path) -> None:
    opts = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path),
            "control_folder": str(tmp_path / "control")}
    with Connection("filesystem://", transport_options=opts) as conn:
        channel = conn.default_channel
        if not hasattr(channel, "_exchange_file"):
            assert exchange_table(channel, "x").name == "x.exchange"  # kombu < 5.7: no check
            return
        with pytest.raises(ChannelError):
            exchange_table(channel, "../escape")


def test_publish_first_sends_nothing_on_a_transport_without_lists_to_push_onto() -> None:
    """Only kombu's Redis transport has a head to publish at; elsewhere the caller publishes
    as usual (the Redis side: tests/integration/test_broker_priority.py)."""
    with Connection("memory://") as conn:
        producer = conn.Producer()
        assert not publish_first(producer, b"{}", exchange="", routing_key="q", headers={},
                                 content_type="application/json", content_encoding="utf-8",
                                 properties={"priority": 0})
        assert conn.default_channel.basic_get("q") is None


def test_a_woken_message_goes_one_priority_up_on_rabbitmq_only() -> None:
    assert [woken_priority("amqp", p) for p in (None, 0, 3, 254, 255, True)] == [1, 1, 4, 255, 255, 1]
    assert [woken_priority("redis", p) for p in (None, 0, 6)] == [None, 0, 6]
    assert woken_priority("memory", 5) == 5


def test_confirming_is_for_py_amqp_alone() -> None:
    # Elsewhere (Redis, the in-memory and filesystem transports) a wake publishes on the
    # pooled producer as before: those transports have no publisher confirms.
    app = Celery("confirming", broker="memory://", set_as_current=False)
    with app.producer_pool.acquire(block=True) as producer:
        assert confirming(producer) is None
    # What confirming() binds on py-amqp's channel, and the nack it translates, are still there.
    from amqp.channel import Channel
    from amqp.exceptions import MessageNacked

    assert callable(Channel.basic_publish_confirm) and issubclass(MessageNacked, Exception)


@pytest.mark.parametrize("results", ["redis", "database"])
def test_store_states_never_overwrites_an_ending(results: str, tmp_path: Path, redis_url: str) -> None:
    """A PARKED written late (the task was woken and ended elsewhere meanwhile, or revoked)
    leaves the ending; a task still pending gets it. Celery's backends keep a SUCCESS
    themselves, not a FAILURE or a REVOKED."""
    from celery_flowcontrol.compat import store_states

    url = redis_url if results == "redis" else f"db+sqlite:///{tmp_path / 'results.db'}"
    app = Celery("proj", broker="memory://", backend=url, set_as_current=False)
    ids = {name: f"{name}-{time.time_ns()}" for name in ("success", "failure", "revoked", "waiting")}
    app.backend.store_result(ids["success"], "done", "SUCCESS")
    app.backend.mark_as_failure(ids["failure"], ValueError("boom"))
    app.backend.mark_as_revoked(ids["revoked"], "expired")
    store_states(app.backend, "PARKED", {task_id: {"queue": "q"} for task_id in ids.values()})
    for ending in ("success", "failure", "revoked"):
        assert app.AsyncResult(ids[ending]).state == ending.upper()
    waiting = ids["waiting"]
    assert app.AsyncResult(waiting).state == "PARKED"
    assert app.AsyncResult(waiting).info == {"queue": "q"}


def test_a_confirmed_publish_waits_for_its_ack_at_most_confirm_timeout() -> None:
    # Whatever kombu passes the bound on as (confirm_timeout, or before kombu 5.5 the publish's
    # timeout), py-amqp's confirmed publish waits for the broker's ack at most that long: an
    # ack that never comes is a lost connection, not a wake stuck for good. A py-amqp channel
    # with no broker: its two wire calls (the publish, the wait for the ack) are recorded.
    from amqp import spec
    from kombu.transport.pyamqp import Channel

    from celery_flowcontrol.compat import CONFIRM_TIMEOUT, _Confirming

    sent: list[dict[str, object]] = []
    waits: list[tuple[object, object]] = []
    channel = Channel.__new__(Channel)
    channel.events = defaultdict(set)
    channel._confirm_selected = True  # confirm.select sent already
    channel._basic_publish = lambda *args, **kwargs: sent.append(kwargs)  # type: ignore[method-assign]
    channel.wait = lambda methods, callback=None, timeout=None: waits.append((methods, timeout))  # type: ignore[method-assign]

    class Connection:  # what _Confirming asks of kombu's connection here: a channel
        def channel(self) -> Channel:
            return channel

    producer = _Confirming(Connection())
    assert producer.channel is channel and channel.basic_publish == channel.basic_publish_confirm
    producer.publish(b"{}", exchange="", routing_key="q", content_type="application/json",
                     content_encoding="utf-8")
    assert waits == [([spec.Basic.Ack, spec.Basic.Nack], CONFIRM_TIMEOUT)]
    assert len(sent) == 1 and sent[0]["mandatory"] is True


def test_a_flow_task_run_keeps_the_request_it_runs_in() -> None:
    # FlowTask has a __call__ of its own, which calls Task.__call__. Where Celery's worker
    # "stack protection" is not installed (here an eager apply; an in-process WorkController),
    # Celery before 5.5 pushed a bare context there: the run saw no id, called directly.
    from celery_flowcontrol import FlowTask

    app = Celery("request", broker="memory://", set_as_current=False)

    @app.task(base=FlowTask, bind=True, name="seen", shared=False)
    def seen(self: Any, x: int) -> tuple[Any, ...]:
        r = self.request
        return r.id, r.called_directly, r.is_eager, r.retries, r.args, x

    assert seen.apply((3,), task_id="t-1", retries=2).get() == ("t-1", False, True, 2, (3,), 3)
    assert seen(4)[:2] == (None, True)  # a plain call is still called directly
