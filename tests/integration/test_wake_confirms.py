"""No wake publish lost on RabbitMQ: a publish the broker refuses keeps its row.

On a real RabbitMQ broker, with a real SQLite parking table: a row woken towards an exchange
that was deleted (the broker closes the channel, 404), towards a queue bound to nothing
(returned as unroutable: a mandatory publish) or into a full queue that rejects publishes
(nacked) is not deleted as if published. It is tried again on later passes, the rows around
it published meanwhile on the same connection, and dead-lettered with the broker's reason
once its claims run out; with the exchange or binding back (or the letter requeued) its
message reaches the queue once. The clock of the passes is the test's own, so the retries'
pauses cost no time.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from celery import Celery
from kombu import Exchange, Queue

from celery_flowcontrol.compat import confirming
from celery_flowcontrol.parking import ParkedMessage, ParkingStore
from celery_flowcontrol.parking.dead_letters import DeadLetterTable
from celery_flowcontrol.worker.republish import RETRY_AFTER, WAKE_ATTEMPTS, WAKE_FAILED, wake_due


@pytest.fixture
def app(rabbitmq_url: str, key_prefix: str, sqlite_url: str) -> Iterator[Celery]:
    app = Celery("confirms", broker=rabbitmq_url, set_as_current=False)
    app.conf.update(flowcontrol_parking_url=sqlite_url, flowcontrol_key_prefix=key_prefix)
    app.conf.task_queues = [Queue(f"{key_prefix}.q", Exchange(f"{key_prefix}.q"), routing_key=f"{key_prefix}.q")]
    with app.connection_for_write() as conn:
        app.conf.task_queues[0](conn.default_channel).declare()
    yield app
    with app.connection_for_write() as conn:
        app.conf.task_queues[0](conn.default_channel).delete()
        Exchange(f"{key_prefix}.gone", "direct")(conn.default_channel).delete()


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def row(task_id: str, exchange: str, routing_key: str, wake_at: float) -> ParkedMessage:
    return ParkedMessage(task_id=task_id, queue="api", body=b'[[], {}, {"callbacks": null}]',
                         wake_at=wake_at, task_name="proj.t", headers={"id": task_id, "task": "proj.t"},
                         properties={"delivery_mode": 2}, exchange=exchange, routing_key=routing_key)  # fmt: skip


def drain(app: Celery, queue: Queue, settle: float = 0.5) -> list[str]:
    """Every message now in *queue* (its task ids), waiting *settle* s after the last."""
    ids = []
    with app.connection_for_write() as conn:
        bound = queue(conn.default_channel)
        last = time.monotonic()
        while time.monotonic() - last < settle:
            message = bound.get(no_ack=True)
            if message is None:
                time.sleep(0.02)
                continue
            ids.append(message.headers["id"])
            last = time.monotonic()
    return ids


def passes_until_dead(app: Celery, store: ParkingStore, clock: Clock, task_id: str) -> int:
    """Wake passes, each after the row's retry pause, until *task_id* is dead-lettered."""
    for n in range(1, WAKE_ATTEMPTS + 2):
        row_now = store.get(task_id)
        if row_now is None:
            return n - 1
        clock.now = max(clock.now, row_now.wake_at) + 0.01
        assert wake_due(app, store, clock) == 0
    raise AssertionError(f"{task_id} still parked after {WAKE_ATTEMPTS + 1} passes")


def test_a_deleted_exchange_keeps_the_row_and_the_task_is_sent_once_it_is_back(app: Celery, key_prefix: str) -> None:
    q = app.conf.task_queues[0]
    gone = Exchange(f"{key_prefix}.gone", "direct", durable=False)
    store = ParkingStore(app.conf.flowcontrol_parking_url)
    clock = Clock()
    # Rows either side of the refused one, in one claimed batch (oldest first).
    store.park(row("before", q.exchange.name, q.routing_key, clock.now - 3))
    store.park(row("lost?", gone.name, q.routing_key, clock.now - 2))
    store.park(row("after", q.exchange.name, q.routing_key, clock.now - 1))

    assert wake_due(app, store, clock) == 2
    assert sorted(drain(app, q)) == ["after", "before"]  # the connection went on after the 404
    kept = store.get("lost?")
    assert kept is not None and kept.claimed_until is None  # not deleted, not held
    assert kept.wake_at == pytest.approx(clock.now + RETRY_AFTER)
    assert wake_due(app, store, clock) == 0  # its pause is not over

    clock.now = kept.wake_at + 0.01
    assert wake_due(app, store, clock) == 0  # refused again
    assert store.get("lost?") is not None and store.dead_letters() == []

    with app.connection_for_write() as conn:  # the operator declares it again, bound
        gone(conn.default_channel).declare()
        conn.default_channel.queue_bind(q.name, gone.name, q.routing_key)
    clock.now = store.get("lost?").wake_at + 0.01
    assert wake_due(app, store, clock) == 1
    assert drain(app, q) == ["lost?"]  # once
    assert store.count() == 0 and store.dead_letters() == []
    store.close()


def test_a_deleted_exchange_dead_letters_the_row_with_the_brokers_reason(app: Celery, key_prefix: str) -> None:
    q = app.conf.task_queues[0]
    store = ParkingStore(app.conf.flowcontrol_parking_url)
    clock = Clock()
    store.park(row("t", f"{key_prefix}.gone", q.routing_key, clock.now - 1))

    assert passes_until_dead(app, store, clock, "t") == WAKE_ATTEMPTS
    (dead,) = store.dead_letters()
    assert dead.task_id == "t" and dead.reason == WAKE_FAILED
    assert f"NOT_FOUND - no exchange '{key_prefix}.gone'" in dead.error
    assert drain(app, q) == []
    store.close()


def test_a_queue_bound_nowhere_is_refused_then_requeued_and_sent_once(app: Celery, key_prefix: str) -> None:
    q = app.conf.task_queues[0]
    store = ParkingStore(app.conf.flowcontrol_parking_url)
    clock = Clock()
    # The exchange exists, but nothing is bound with this routing key: the broker would
    # drop the message; a mandatory publish has it returned.
    store.park(row("t", q.exchange.name, f"{key_prefix}.nowhere", clock.now - 1))
    store.park(row("ok", q.exchange.name, q.routing_key, clock.now - 1))

    assert wake_due(app, store, clock) == 1
    assert drain(app, q) == ["ok"]
    assert passes_until_dead(app, store, clock, "t") == WAKE_ATTEMPTS - 1
    (dead,) = store.dead_letters()
    assert dead.reason == WAKE_FAILED and "NO_ROUTE" in dead.error and "returned" in dead.error

    with app.connection_for_write() as conn:
        conn.default_channel.queue_bind(q.name, q.exchange.name, f"{key_prefix}.nowhere")
    assert [r.refused for r in DeadLetterTable(store).requeue([dead.id], now=clock.now)] == [None]
    assert wake_due(app, store, clock) == 1
    assert drain(app, q) == ["t"]
    assert store.count() == 0 and store.dead_letters() == []
    store.close()


def test_a_nacked_publish_keeps_its_row(app: Celery, key_prefix: str) -> None:
    full = Queue(f"{key_prefix}.full", Exchange(f"{key_prefix}.q"), routing_key=f"{key_prefix}.full",
                 max_length=1, queue_arguments={"x-overflow": "reject-publish"})
    with app.connection_for_write() as conn:
        full(conn.default_channel).declare()
    try:
        store = ParkingStore(app.conf.flowcontrol_parking_url)
        clock = Clock()
        store.park(row("first", full.exchange.name, full.routing_key, clock.now - 2))
        store.park(row("second", full.exchange.name, full.routing_key, clock.now - 1))

        assert wake_due(app, store, clock) == 1
        assert store.get("first") is None and store.get("second") is not None
        assert drain(app, full) == ["first"]  # room again
        clock.now = store.get("second").wake_at + 0.01
        assert wake_due(app, store, clock) == 1
        assert drain(app, full) == ["second"]
        assert store.count() == 0 and store.dead_letters() == []
        store.close()
    finally:
        with app.connection_for_write() as conn:
            full(conn.default_channel).delete()


def test_after_a_lost_connection_wakes_are_still_confirmed(app: Celery, key_prefix: str) -> None:
    q = app.conf.task_queues[0]
    store = ParkingStore(app.conf.flowcontrol_parking_url)
    clock = Clock()
    store.park(row("first", q.exchange.name, q.routing_key, clock.now - 1))
    assert wake_due(app, store, clock) == 1
    with app.producer_pool.acquire(block=True) as producer:
        own = confirming(producer)
        assert own is not None and own.channel.basic_publish == own.channel.basic_publish_confirm
        # The socket under the pooled connection dies: kombu's retry reconnects the connection
        # and revives the producer with its default channel; the wake's gets a confirming one.
        producer.connection.connection.transport.sock.shutdown(socket.SHUT_RDWR)
    store.park(row("second", q.exchange.name, q.routing_key, clock.now - 1))
    store.park(row("nowhere", q.exchange.name, f"{key_prefix}.nowhere", clock.now - 1))
    assert wake_due(app, store, clock) == 1
    assert sorted(drain(app, q)) == ["first", "second"]
    assert store.get("nowhere") is not None  # returned: the channel still confirms
    store.close()
