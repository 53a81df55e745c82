"""Parks in batches (worker/parkbatch.py) on real parts: a real kombu event loop (Hub) and
consumer QoS, a real SQLite file or PostgreSQL schema, a real Redis broker channel for the acks.

The story: the denials of a turn of the loop are committed together by the writer thread, then
acked, each only once its row is committed; a batch whose commit fails acks none, and its
messages are tried again; a task id twice in a batch parks once; the batch keeps the order of
arrival; a message that can't be stored is dead-lettered without sinking the others; the
prefetch window is given back to the messages waiting, and taken again once they are acked; a
consumer that stops forgets what waits (unacked: the broker delivers it again). On kombu's Redis
transport the writer acks a batch itself, in one round trip, once its commit is done, and the
loop only records the acks.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue
from kombu.asynchronous import Hub
from kombu.common import QoS

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.compat import ack_together
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkingStore, migrate
from celery_flowcontrol.worker.delivery import DeliveryState
from celery_flowcontrol.worker.gate import Outcome
from tests.support.messages import TASK, Acks, make_gate, message


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    url = str(request.getfixturevalue(f"{request.param}_url"))
    if not url.startswith("sqlite"):
        migrate(url)
    return url


@pytest.fixture
def store(db_url: str) -> Iterator[ParkingStore]:
    s = ParkingStore(db_url)
    yield s
    s.close()


class Loop:
    """A gate whose parks go into batches on a real kombu Hub, driven turn by turn."""

    def __init__(self, store: ParkingStore) -> None:
        self.store = store
        self.backend = MemoryBackend()
        self.backend.register(QueueConfig("api", concurrency=1))
        self.gate = make_gate(self.backend, store)
        self.hub = Hub()
        self.windows: list[int] = []
        self.qos = QoS(lambda prefetch_count: self.windows.append(prefetch_count), 4)
        self.gate.batch.attach(self.hub, self.qos)
        self.outcomes: dict[str, list[Outcome]] = {}
        assert self.decide(message()) is Outcome.RUN  # the one slot is taken: the rest is denied

    def decide(self, m: Any, acks: Callable[[], Any] = lambda: None) -> Outcome:
        """One delivery, as the strategy hands it over on the loop (with a ``later``)."""
        later = self.outcomes.setdefault(m.headers["id"], []).append
        return self.gate.on_message(m, TASK, acks, None, later, DeliveryState())

    def turn(self, until: Callable[[], bool], timeout: float = 10.0) -> None:
        """Run the loop until *until* holds."""
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "the loop did not get there in time"
            next(self.hub.loop)
            if self.qos.prev != self.qos.value:  # what Celery's loop does on every turn
                self.qos.update()

    def close(self) -> None:
        self.gate.close()
        self.hub.close()


@pytest.fixture
def loop(store: ParkingStore) -> Iterator[Loop]:
    lp = Loop(store)
    yield lp
    lp.close()


def test_the_denials_of_a_turn_are_committed_together_then_acked(loop: Loop, store: ParkingStore) -> None:
    ms = [message(flow_priority=i % 3) for i in range(20)]
    acks = [Acks(store, m.headers["id"]) for m in ms]
    assert [loop.decide(m, a) for m, a in zip(ms, acks, strict=True)] == [Outcome.ASKED] * 20
    assert store.count() == 0 and sum(a.calls for a in acks) == 0, "nothing stored or acked yet"
    assert loop.qos.value == 4 + 20, "each waiting message has its window place back"
    loop.turn(lambda: all(loop.outcomes[m.headers["id"]] for m in ms))
    assert all(loop.outcomes[m.headers["id"]] == [Outcome.PARKED] for m in ms)
    assert all(a.calls == 1 and a.row_was_there == [True] for a in acks), "acked once, after commit"
    assert loop.gate.batch.batches == 1 and loop.gate.parked == 20
    assert loop.qos.value == 4 and loop.windows[-1] == 4, "the window is back to what it was"
    seqs = [store.get(m.headers["id"]).seq for m in ms]  # type: ignore[union-attr]
    assert seqs == sorted(seqs), "the batch keeps the order of arrival"
    assert loop.backend.stats("api").waiting == 20


def test_denials_that_come_while_a_batch_commits_are_the_next_batch(loop: Loop, store: ParkingStore) -> None:
    first = [message() for _ in range(3)]
    for m in first:
        loop.decide(m)
    next(loop.hub.loop)  # the turn ends: the batch goes to the writer
    second = [message() for _ in range(5)]
    for m in second:
        loop.decide(m)
    loop.turn(lambda: all(loop.outcomes[m.headers["id"]] for m in first + second))
    assert store.count() == 8 and 1 < loop.gate.batch.batches <= 3


def test_while_denials_keep_coming_a_batch_starts_at_most_every_so_often(
        loop: Loop, store: ParkingStore) -> None:
    """A commit costs about as much for one row as for a dozen: the denials of the next few
    turns of the loop wait for the batch after, not one commit each."""
    loop.gate.batch.every = 0.5
    first = message()
    began = time.monotonic()
    loop.decide(first)
    loop.turn(lambda: bool(loop.outcomes[first.headers["id"]]))
    then = [message() for _ in range(4)]
    for m in then[:2]:
        loop.decide(m)
    for _ in range(2):  # turns of the loop end meanwhile
        next(loop.hub.loop)
    assert not any(loop.outcomes[m.headers["id"]] for m in then[:2]), "they wait for their time"
    for m in then[2:]:
        loop.decide(m)
    loop.turn(lambda: all(loop.outcomes[m.headers["id"]] for m in then))
    assert time.monotonic() - began >= 0.5
    assert loop.gate.batch.batches == 2 and store.count() == 5, "the four went in one batch"


def test_a_batch_whose_commit_fails_acks_none_and_its_messages_come_back(
        loop: Loop, store: ParkingStore, db_url: str) -> None:
    ms = [message() for _ in range(5)]
    acks = [Acks(store, m.headers["id"]) for m in ms]
    store.count()  # the tables exist
    undo = fail_the_third_insert(store, db_url, ms[2].headers["id"])
    try:
        for m, a in zip(ms, acks, strict=True):
            loop.decide(m, a)
        loop.turn(lambda: all(loop.outcomes[m.headers["id"]] for m in ms), timeout=30)
    finally:
        undo()
    assert all(loop.outcomes[m.headers["id"]] == [Outcome.DEFER] for m in ms)
    assert sum(a.calls for a in acks) == 0, "none acked: none was committed"
    assert store.count() == 0 and loop.gate.batch.batches == 0
    assert loop.qos.value == 4
    # The strategy decides each again after a moment (DEFER): now they park.
    for m, a in zip(ms, acks, strict=True):
        loop.outcomes[m.headers["id"]].clear()
        loop.decide(m, a)
    loop.turn(lambda: all(loop.outcomes[m.headers["id"]] for m in ms))
    assert all(a.calls == 1 and a.row_was_there == [True] for a in acks)
    assert store.count() == 5


def fail_the_third_insert(store: ParkingStore, db_url: str, task_id: str) -> Callable[[], None]:
    """Make the database fail a batch part-way: SQLite, by another writer holding the file's
    lock (the batch can't begin); PostgreSQL, by a trigger that fails *task_id*'s insert after
    the rows before it went in (not a value refused: an error of the statement)."""
    durable, _ = store.db.engines()
    if store.dialect == "sqlite":
        store.db.timeout = 0.2
        store.close()  # reconnect with the short busy timeout
        blocker = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")

        def release() -> None:
            blocker.execute("ROLLBACK")
            blocker.close()

        return release
    with durable.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION boom() RETURNS trigger AS $$ BEGIN "
            f"IF NEW.task_id = '{task_id}' THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$ "
            "LANGUAGE plpgsql")
        conn.exec_driver_sql("CREATE TRIGGER boom BEFORE INSERT ON flowcontrol_parked "
                             "FOR EACH ROW EXECUTE FUNCTION boom()")

    def drop() -> None:
        with durable.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER boom ON flowcontrol_parked")

    return drop


def test_a_task_id_twice_in_a_batch_parks_once_and_both_deliveries_are_acked(
        loop: Loop, store: ParkingStore) -> None:
    m = message()
    copy = message(id=m.headers["id"])
    acks = Acks(store, m.headers["id"])
    loop.decide(m, acks)
    loop.decide(copy, acks)
    loop.turn(lambda: acks.calls == 2)
    assert store.count() == 1 and acks.row_was_there == [True, True]
    assert loop.outcomes[m.headers["id"]] == [Outcome.PARKED, Outcome.PARKED]


def test_a_message_that_cant_be_stored_is_dead_lettered_and_the_others_park(
        loop: Loop, store: ParkingStore) -> None:
    ms = [message(), message(odd=object()), message()]  # a header no row can keep
    acks = [Acks(store, m.headers["id"]) for m in ms]
    for m, a in zip(ms, acks, strict=True):
        loop.decide(m, a)
    loop.turn(lambda: all(a.calls for a in acks))
    assert [a.calls for a in acks] == [1, 1, 1]
    assert store.count() == 2 and store.dead_counts() == {"park-rejected": 1}
    assert all(loop.outcomes[m.headers["id"]] == [Outcome.PARKED] for m in ms)


def test_a_consumer_that_stops_forgets_what_waits_unacked(loop: Loop, store: ParkingStore) -> None:
    ms = [message() for _ in range(3)]
    acks = [Acks(store, m.headers["id"]) for m in ms]
    for m, a in zip(ms, acks, strict=True):
        loop.decide(m, a)
    loop.gate.batch.detach()  # the consumer stopped before the turn ended
    for _ in range(5):
        next(loop.hub.loop)
    time.sleep(0.2)
    assert store.count() == 0 and sum(a.calls for a in acks) == 0
    assert all(loop.outcomes[m.headers["id"]] == [] for m in ms), "the broker delivers them again"


def test_outside_the_loop_a_denial_parks_at_once(store: ParkingStore) -> None:
    """No ``later`` (a resumed waiter, a retry) or no loop: the park commits before the gate
    answers, as it always did."""
    lp = Loop(store)
    try:
        m = message()
        acks = Acks(store, m.headers["id"])
        assert lp.gate.on_message(m, TASK, acks) is Outcome.PARKED
        assert acks.row_was_there == [True]
        lp.gate.batch.detach()
        n = message()
        assert lp.decide(n) is Outcome.PARKED
    finally:
        lp.close()


# -- the acks of a batch, in one round trip on the Redis broker ---------------------------------


def delivered(conn: Connection, channel: Any, queue: Queue, n: int) -> list[Any]:
    """The first *n* messages of *queue* delivered on *channel*, left unacked."""
    got: list[Any] = []
    with conn.Consumer(queue, channel=channel, callbacks=[lambda body, m: got.append(m)]):
        channel.basic_qos(0, 10, False)
        while len(got) < n:
            conn.drain_events(timeout=5)
    return got


def test_acks_of_a_batch_go_together_on_the_redis_transport(redis_url: str) -> None:
    prefix = f"fct-{uuid.uuid4().hex[:8]}:"
    exchange = Exchange(f"{prefix}x", type="direct")
    queue = Queue(f"{prefix}q", exchange, routing_key="k")
    with Connection(redis_url, transport_options={"global_keyprefix": prefix}) as conn:
        channel = conn.channel()
        producer = conn.Producer(channel)
        for i in range(5):
            producer.publish({"n": i}, exchange=exchange, routing_key="k", declare=[queue])
        got = delivered(conn, channel, queue, 5)
        qos = channel.qos
        client = channel.client
        assert client.hlen(qos.unacked_key) == 5, "kombu keeps each unacked message in Redis"
        assert ack_together(got[:4]) is True
        assert client.hlen(qos.unacked_key) == 1
        assert all(m.acknowledged for m in got[:4]) and not got[4].acknowledged
        assert ack_together([got[0], got[4]]) is False, "one acked already: none acked here"
        assert not got[4].acknowledged
        got[4].ack()
        assert client.hlen(qos.unacked_key) == 0
        channel.close()
    plain = redis.Redis.from_url(redis_url)
    try:  # the channel closed: what was unacked would be back in the queue's list by now
        assert plain.llen(f"{prefix}{queue.name}") == 0, "nothing comes back: all were acked"
    finally:
        plain.close()


def test_on_the_redis_broker_the_writer_acks_a_batch_only_once_it_is_committed(
        redis_url: str, tmp_path: Any) -> None:
    """Real deliveries of a Redis broker channel: while the parking file's write lock is held
    elsewhere, the batch can't commit and every message stays unacked in the broker; once the
    lock is let go the rows commit and the writer acks them all (the loop never calls Celery's
    ack), and kombu's bookkeeping of the channel knows them acked."""
    url = f"sqlite:///{tmp_path / 'park.sqlite3'}"
    store = ParkingStore(url)
    store.count()  # the tables exist
    prefix = f"fct-{uuid.uuid4().hex[:8]}:"
    exchange = Exchange(f"{prefix}x", type="direct")
    queue = Queue(f"{prefix}q", exchange, routing_key="k")
    lp = Loop(store)
    blocker = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        with Connection(redis_url, transport_options={"global_keyprefix": prefix}) as conn:
            channel = conn.channel()
            producer = conn.Producer(channel)
            for _ in range(5):
                tid = uuid.uuid4().hex
                producer.publish([[1], {}, {}], exchange=exchange, routing_key="k", declare=[queue],
                                 headers={"id": tid, "task": TASK.name, "root_id": tid, "flow_queue": "api"})
            got = delivered(conn, channel, queue, 5)
            client = channel.client
            acks = [Acks(store, m.headers["id"]) for m in got]
            blocker.execute("BEGIN IMMEDIATE")
            assert [lp.decide(m, a) for m, a in zip(got, acks, strict=True)] == [Outcome.ASKED] * 5
            for _ in range(20):  # the writer waits for the lock meanwhile
                next(lp.hub.loop)
                time.sleep(0.01)
            assert client.hlen(channel.qos.unacked_key) == 5, "nothing acked before its commit"
            assert store.count() == 0
            blocker.execute("ROLLBACK")
            lp.turn(lambda: all(lp.outcomes[m.headers["id"]] for m in got))
            assert all(lp.outcomes[m.headers["id"]] == [Outcome.PARKED] for m in got)
            assert store.count() == 5 and lp.gate.batch.batches == 1
            assert client.hlen(channel.qos.unacked_key) == 0, "the writer acked the batch"
            assert sum(a.calls for a in acks) == 0, "the loop never waited on an ack"
            assert all(m.acknowledged for m in got)
            assert channel.qos.can_consume_max_estimate() == 10, "the channel's window is free"
            channel.close()
    finally:
        blocker.close()
        lp.close()
        store.close()
