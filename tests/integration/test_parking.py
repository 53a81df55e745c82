"""The parking store on a real SQLite file and a real PostgreSQL schema.

The story: a denied message is parked (once, whatever the redeliveries), comes back exactly as it
went in, is claimed when due by one waker only, and is deleted once republished. A waker that dies
holding a claim loses it when its lease runs out. What can never be stored is rejected (to be
dead-lettered); a database that can't be reached is an outage, so the caller never acks.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from celery_flowcontrol.errors import ParkingUnavailableError
from celery_flowcontrol.parking import DeadLetter, ParkedMessage, ParkingRejectedError, ParkingStore, migrate
from celery_flowcontrol.parking.migrate import PLUGIN_LOGGER, VERSION_TABLE, current_revisions, include_object
from celery_flowcontrol.parking.model import Base
from celery_flowcontrol.parking.paused import PausedRows

T0 = 1_700_000_000.0
LEASE = 30.0
UNREACHABLE_PG = "postgresql+psycopg://postgres@127.0.0.1:1/test"


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty database: a SQLite file, or a PostgreSQL schema of this test's own."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(db_url: str, clock: Clock) -> Iterator[ParkingStore]:
    """A store on a migrated database (SQLite creates its tables itself; PostgreSQL is migrated)."""
    if not db_url.startswith("sqlite"):
        migrate(db_url)
    parking = ParkingStore(db_url, clock=clock, claim_lease=LEASE)
    yield parking
    parking.close()


def msg(task_id: str, wake_at: float = T0, **fields: Any) -> ParkedMessage:
    fields.setdefault("queue", "emails")
    fields.setdefault("body", f"body of {task_id}".encode())
    return ParkedMessage(task_id=task_id, wake_at=wake_at, **fields)


def ids(messages: list[ParkedMessage]) -> list[str]:
    return [m.task_id for m in messages]


# -- park, and read back exactly what went in ------------------------------------------------


def test_park_then_get_round_trips_every_byte_and_header(store: ParkingStore) -> None:
    body = bytes(range(256)) + b"\xff\xfe\x00 not utf-8 \xc3\x28"
    headers = {
        "lang": "py",
        "task": "app.send_mail",
        "id": "t-1",
        "argsrepr": "('héllo wörld', '日本語', '🚀')",
        "timelimit": [None, 30],
        "retries": 0,
        "eta": None,
        "flow_queue": "emails",
        "flow_priority": 5,
        "fairness_key": "tenant-ü",
        "nested": {"a": [1, 2.5, True, False, None], "ключ": "значение", "nul": "a\x00b", "lone": "\ud800"},
        # AMQP headers may carry types JSON lacks: they come back as the same types.
        "x-raw": b"\x00\x01\xff",
        "x-death-time": dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.timezone.utc),
        "x-day": dt.date(2024, 5, 1),
        "x-price": decimal.Decimal("12.340"),
    }
    properties = {
        "correlation_id": "t-1",
        "reply_to": "c0ffee",
        "delivery_mode": 2,
        "priority": 3,
        "delivery_info": {"exchange": "", "routing_key": "celery"},
        "body_encoding": "base64",
    }
    original = msg(
        "t-1",
        T0 + 5,
        body=body,
        task_name="app.send_mail",
        priority=-7,
        fairness_key="tenant-ü",
        content_type="application/x-python-serialize",
        content_encoding="binary",
        headers=headers,
        properties=properties,
        exchange="celery",
        routing_key="celery",
        reason="rate",
    )
    assert store.park(original) is True

    got = store.get("t-1")
    assert got is not None
    assert got.body == body and isinstance(got.body, bytes)
    assert got.headers == headers
    assert type(got.headers["x-raw"]) is bytes and type(got.headers["x-price"]) is decimal.Decimal
    assert got.properties == properties
    assert got.seq is not None and got.parked_at == T0 and got.claimed_until is None
    # Everything else is exactly what was parked.
    assert got == ParkedMessage(**{**original.__dict__, "seq": got.seq, "parked_at": T0})


def test_a_redelivered_message_parks_once(store: ParkingStore) -> None:
    assert store.park(msg("t-1", body=b"first")) is True
    # The broker redelivers it (the worker died between commit and ack): no error, no second row.
    assert store.park(msg("t-1", body=b"redelivery")) is False
    assert store.count() == 1
    got = store.get("t-1")
    assert got is not None and got.body == b"first"


def test_arrival_sequence_increases(store: ParkingStore) -> None:
    for n in range(5):
        store.park(msg(f"t-{n}"))
    seqs = [seq_of(store, f"t-{n}") for n in range(5)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 5
    # Not reused even when the newest row is gone (SQLite AUTOINCREMENT, PostgreSQL sequence).
    store.done("t-4")
    store.park(msg("t-5"))
    assert seq_of(store, "t-5") > seqs[-1]


def seq_of(store: ParkingStore, task_id: str) -> int:
    parked = store.get(task_id)
    assert parked is not None and parked.seq is not None
    return parked.seq


# -- parks in batches: one transaction for a worker's denials of one turn ---------------------------


def refuse(store: ParkingStore, task_id: str, integrity: bool = True) -> None:
    """A trigger that makes the database itself refuse the row of *task_id*: as a value it
    can't take (an IntegrityError), or, with ``integrity=False``, as a failure of the
    statement (an outage: the transaction is lost)."""
    store.count()  # the table exists
    durable, _ = store.db.engines()
    with durable.begin() as conn:
        if store.dialect == "sqlite":
            assert integrity  # SQLite's RAISE is always a constraint failure
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse BEFORE INSERT ON flowcontrol_parked "
                f"WHEN NEW.task_id = '{task_id}' BEGIN SELECT RAISE(ABORT, 'refused'); END")
        else:
            code = "check_violation" if integrity else "raise_exception"
            conn.exec_driver_sql(
                "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN "
                f"IF NEW.task_id = '{task_id}' THEN RAISE EXCEPTION 'refused' USING ERRCODE = '{code}'; "
                "END IF; RETURN NEW; END $$ LANGUAGE plpgsql")
            conn.exec_driver_sql("CREATE TRIGGER refuse BEFORE INSERT ON flowcontrol_parked "
                                 "FOR EACH ROW EXECUTE FUNCTION refuse()")


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "sqlalchemy"])
def test_park_many_commits_a_batch_in_arrival_order_and_a_task_id_once(store: ParkingStore, fast: bool) -> None:
    store.db.use_fast_path = fast
    assert store.park(msg("old")) is True
    batch = [msg("b-0", body=b"first"), msg("b-1"), msg("old"), msg("b-0", body=b"again"), msg("b-2")]
    assert store.park_many(batch) == [True, True, False, False, True]
    assert store.count() == 4
    got = store.get("b-0")
    assert got is not None and got.body == b"first"  # a duplicate inside the batch parked once
    seqs = [seq_of(store, t) for t in ("old", "b-0", "b-1", "b-2")]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4  # the batch's order is its arrival order
    assert store.park_many([]) == []


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "sqlalchemy"])
def test_park_many_a_message_that_cant_be_stored_does_not_sink_the_others(store: ParkingStore,
                                                                         fast: bool) -> None:
    store.db.use_fast_path = fast
    refuse(store, "poison")
    batch = [msg("a"), msg("x" * 300), msg("poison"), msg("b")]
    results = store.park_many(batch)
    assert results[0] is True and results[3] is True
    assert isinstance(results[1], ParkingRejectedError) and results[1].field == "task_id"
    assert isinstance(results[2], ParkingRejectedError) and "refused" in str(results[2])
    assert sorted(m.task_id for m in store.list("emails")) == ["a", "b"]
    assert seq_of(store, "a") < seq_of(store, "b")


def test_park_many_an_outage_commits_none_of_the_batch(db_url: str, store: ParkingStore) -> None:
    """A batch that fails part-way is rolled back whole: the caller acks none of it, and none of
    it is parked (its messages stay in the broker and come back)."""
    store.park(msg("before"))
    if store.dialect == "sqlite":
        blocker = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another writer that doesn't let go
        store.db.timeout = 0.2
        store.close()  # reconnect with the short busy timeout
        try:
            with pytest.raises(ParkingUnavailableError):
                store.park_many([msg("a"), msg("b")])
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
    else:
        refuse(store, "boom", integrity=False)  # the third row's statement fails
        with pytest.raises(ParkingUnavailableError, match="refused"):
            store.park_many([msg("a"), msg("b"), msg("boom"), msg("c")])
    assert ids(store.list("emails")) == ["before"]
    assert store.park_many([msg("a"), msg("b")]) == [True, True]  # the connection is fine after


# -- claims: due rows, in order, one waker per row ------------------------------------------------


def test_claim_due_takes_due_rows_by_priority_then_arrival(store: ParkingStore) -> None:
    store.park(msg("low-old", T0 - 10, priority=0))
    store.park(msg("high", T0 - 1, priority=9))
    store.park(msg("low-new", T0 - 5, priority=0))
    store.park(msg("future", T0 + 20, priority=100))
    store.park(msg("other-queue", T0, queue="sms", priority=3))

    claimed = store.claim_due(now=T0, limit=10)
    assert ids(claimed) == ["high", "other-queue", "low-old", "low-new"]
    assert all(m.claimed_until == T0 + LEASE and m.attempts == 1 for m in claimed)
    # Held rows stay parked (until done) but nobody else can claim them.
    assert store.count() == 5
    assert store.claim_due(now=T0 + 1) == []
    assert ids(store.claim_due(now=T0 + 20)) == ["future"]  # the others are still held


def test_claim_due_honours_the_limit(store: ParkingStore) -> None:
    for n in range(5):
        store.park(msg(f"t-{n}", T0 - 5 + n))
    assert ids(store.claim_due(now=T0, limit=2)) == ["t-0", "t-1"]
    assert ids(store.claim_due(now=T0, limit=2)) == ["t-2", "t-3"]
    assert store.claim_due(now=T0, limit=0) == []


def test_a_crashed_wakers_claim_expires(store: ParkingStore, clock: Clock) -> None:
    store.park(msg("t-1", T0))
    assert ids(store.claim_due(now=T0)) == ["t-1"]  # ... and the waker dies before done().
    assert store.claim_due(now=T0 + LEASE - 0.001) == []
    again = store.claim_due(now=T0 + LEASE)
    assert ids(again) == ["t-1"] and again[0].attempts == 2
    # The default ``now`` is the store's clock.
    clock.now = T0 + 2 * LEASE
    assert ids(store.claim_due()) == ["t-1"]


def test_claim_one_row_for_a_grant_wake(store: ParkingStore) -> None:
    store.park(msg("t-1", T0 + 3600))  # not due for an hour, but its grant came
    claimed = store.claim("t-1", now=T0)
    assert claimed is not None and claimed.task_id == "t-1" and claimed.claimed_until == T0 + LEASE
    assert store.claim("t-1", now=T0 + 1) is None  # leased
    assert store.claim("missing", now=T0) is None
    assert store.claim("t-1", now=T0 + LEASE) is not None  # the lease ran out


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "sqlalchemy"])
def test_waiting_says_whether_a_row_waits_unleased(store: ParkingStore, fast: bool) -> None:
    """The gate's deny-path read: a row that waits (a redelivery of it must not be held), not
    one a waker holds (that row's own republished copy may be held), nor no row."""
    store.db.use_fast_path = fast
    assert store.waiting("t-1", now=T0) is False
    store.park(msg("t-1", T0 + 3600))
    assert store.waiting("t-1", now=T0) is True
    assert store.claim("t-1", now=T0) is not None
    assert store.waiting("t-1", now=T0 + 1) is False  # leased: being woken
    assert store.waiting("t-1", now=T0 + LEASE) is True  # the lease ran out: it waits again
    store.done("t-1")
    assert store.waiting("t-1", now=T0) is False


def test_done_deletes_and_unclaim_releases(store: ParkingStore) -> None:
    for n in range(4):
        store.park(msg(f"t-{n}", T0))
    store.claim_due(now=T0)
    assert store.done(["t-0", "t-1"]) == 2
    assert store.done("t-0") == 0  # already gone: done is idempotent
    assert store.get("t-0") is None and store.count() == 2

    # Republishing t-2 failed: its lease drops and it is due again at once.
    assert store.unclaim(["t-2"]) == 1
    assert ids(store.claim_due(now=T0 + 1)) == ["t-2"]
    store.done("t-2")
    # t-3's republish failed too; try it again later.
    assert store.unclaim("t-3", wake_at=T0 + 100) == 1
    assert store.claim_due(now=T0 + 99) == []
    assert ids(store.claim_due(now=T0 + 100)) == ["t-3"]
    assert store.done([]) == 0 and store.unclaim([]) == 0


def test_done_and_unclaim_take_many_ids(store: ParkingStore) -> None:
    task_ids = [f"t-{n}" for n in range(1203)]  # more than one statement's worth
    for task_id in task_ids[:3]:
        store.park(msg(task_id))
    assert store.unclaim(task_ids) == 3
    assert store.done(task_ids) == 3


def test_a_woken_row_is_deleted_and_remembered_until_woken_keep(store: ParkingStore, clock: Clock) -> None:
    store.park(msg("t-1", T0))
    (first,) = store.claim_due(now=T0)
    assert store.wakes.record([first], ["t-1"]) == 1
    assert store.get("t-1") is None and store.wakes.last("t-1") == ("t-1", (first.seq, 1))
    store.park(msg("t-1", T0))  # its woken copy parked again, and woken again: the last one counts
    (again,) = store.claim_due(now=T0)
    assert store.wakes.record([again], ["t-1~r1"]) == 1 and store.wakes.last("t-1") == ("t-1~r1", (again.seq, 1))
    assert store.wakes.park_again(msg("t-1", T0), "t-1~r1", None) is None  # parked as that row: not stored
    assert store.wakes.park_again(msg("t-1", T0), "t-1~r1", (again.seq, 1)) is True  # that wake's copy
    clock.now = T0 + store.woken_keep - 1
    assert store.wakes.forget() == 0
    clock.now = T0 + store.woken_keep + 1
    assert store.wakes.forget() == 1 and store.wakes.last("t-1") is None


def test_counts_list_reschedule_and_delete(store: ParkingStore) -> None:
    store.park(msg("e-late", T0 + 20))
    store.park(msg("e-early", T0 + 10, priority=1))
    store.park(msg("e-early-low", T0 + 10))
    store.park(msg("s-1", T0, queue="sms"))
    assert store.count() == 4 and store.count("emails") == 3 and store.count("nope") == 0
    assert store.counts() == {"emails": 3, "sms": 1}
    assert ids(store.list("emails")) == ["e-early", "e-early-low", "e-late"]
    assert ids(store.list("emails", limit=1)) == ["e-early"]

    assert store.reschedule("e-late", T0 + 1) is True
    assert store.reschedule("missing", T0) is False
    assert ids(store.list("emails")) == ["e-late", "e-early", "e-early-low"]

    assert store.delete("s-1") is True and store.delete("s-1") is False
    assert store.counts() == {"emails": 3}


def test_wake_now_makes_due_the_rows_of_one_reason_of_a_queue_or_of_its_key(store: ParkingStore) -> None:
    """What ``resume`` runs: only later rows of that queue, reason (and key) move to now."""
    far = T0 + 3600
    store.park(msg("a-1", far, reason="paused", fairness_key="a"))
    store.park(msg("b-1", far, reason="paused", fairness_key="b"))
    store.park(msg("a-rate", far, reason="key-rate", fairness_key="a"))
    store.park(msg("sms-a", far, queue="sms", reason="paused", fairness_key="a"))
    store.park(msg("a-soon", T0 - 1, reason="paused", fairness_key="a"))
    assert PausedRows(store).wake("emails", key="a", now=T0) == 1
    assert ids(store.claim_due(now=T0)) == ["a-1", "a-soon"]  # in arrival order
    assert PausedRows(store).wake("emails", now=T0) == 1  # the whole queue: b-1
    assert ids(store.claim_due(now=T0)) == ["b-1"]
    assert PausedRows(store).wake("emails", now=T0) == 0
    assert store.get("a-rate").wake_at == far and store.get("sms-a").wake_at == far  # type: ignore[union-attr]


# -- what can't be stored, and dead letters ---------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"task_id": "x" * 256}, "task_id"),
        ({"task_id": ""}, "task_id"),
        ({"queue": "q" * 65}, "queue"),
        ({"fairness_key": "k" * 257}, "fairness_key"),
        ({"fairness_key": "nul\x00key"}, "fairness_key"),
        ({"task_name": "\udcff"}, "task_name"),
        ({"priority": "high"}, "priority"),
        ({"priority": 2**40}, "priority"),
        ({"headers": {"obj": object()}}, "headers"),
        ({"properties": "not a dict"}, "properties"),
        ({"body": "text, not bytes"}, "body"),
        ({"wake_at": float("nan")}, "wake_at"),
    ],
)
def test_a_message_that_cant_be_stored_is_rejected(store: ParkingStore, fields: dict[str, Any], field: str) -> None:
    fields = dict(fields)  # the parameters are shared by both databases' runs
    message = msg(fields.pop("task_id", "t-1"), **{"wake_at": T0, **fields})
    with pytest.raises(ParkingRejectedError) as caught:
        store.park(message)
    assert caught.value.field == field and field in str(caught.value)
    assert not isinstance(caught.value, ParkingUnavailableError)
    assert store.count() == 0


def test_dead_letters_keep_what_parking_refused(store: ParkingStore, clock: Clock) -> None:
    too_long = msg("x" * 300, queue="q" * 100, headers={"h": object()}, body=b"\xff\x00")
    with pytest.raises(ParkingRejectedError) as caught:
        store.park(too_long)
    store.dead_letter(too_long, "rejected", caught.value)
    clock.now = T0 + 1
    store.dead_letter(msg("t-2", fairness_key="nul\x00", headers={"ok": "ü"}), "oversized", "body too big")

    newest, oldest = store.dead_letters(limit=10)
    assert isinstance(newest, DeadLetter)
    assert (newest.task_id, newest.reason, newest.error) == ("t-2", "oversized", "body too big")
    assert newest.created_at == T0 + 1
    assert newest.message.headers == {"ok": "ü"} and newest.message.fairness_key == "nul\\x00"
    assert oldest.task_id == "x" * 300 and oldest.queue == "q" * 100
    assert oldest.message.body == b"\xff\x00" and oldest.error.startswith("ParkingRejectedError: ")
    assert "repr" in oldest.message.headers  # what JSON can't hold is kept as text
    assert [d.task_id for d in store.dead_letters(limit=1)] == ["t-2"]
    assert store.count() == 0  # dead letters are not parked messages


# -- concurrency --------------------------------------------------------------------------------------


def test_concurrent_claimers_never_claim_a_row_twice(db_url: str, store: ParkingStore) -> None:
    for n in range(200):
        store.park(msg(f"t-{n:03}", T0 - 1))
    start = threading.Barrier(2)
    # Between batches a waker "republishes" for a moment, and meanwhile the other gets its
    # turn: without it SQLite's busy handler lets one thread take the write lock every time,
    # and on a loaded machine one PostgreSQL thread could finish before the other starts.
    pause = 0.002 if store.dialect == "sqlite" else 0.001
    claimed: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def waker(slot: int) -> None:
        # Each waker has its own store, so its own pool and connections, as two workers would.
        own = ParkingStore(db_url, claim_lease=LEASE)
        try:
            own.count()  # connect (and on SQLite, check the tables) before the race starts
            start.wait()
            while batch := own.claim_due(now=T0, limit=5):
                claimed[slot].extend(ids(batch))
                time.sleep(pause)
                own.done(ids(batch))
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=waker, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=50)
    assert not errors
    assert set(claimed[0]).isdisjoint(claimed[1])
    assert sorted(claimed[0] + claimed[1]) == [f"t-{n:03}" for n in range(200)]
    assert claimed[0] and claimed[1], "both wakers should have claimed some rows"
    assert store.count() == 0


def test_a_claimer_skips_rows_locked_by_another_transaction(postgres_url: str) -> None:
    migrate(postgres_url)
    store = ParkingStore(postgres_url, claim_lease=LEASE)
    for n in range(4):
        store.park(msg(f"t-{n}", T0 - 10 + n))
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as other, other.begin():
            # Another waker is in the middle of claiming the two oldest rows.
            other.execute(sa.text("SELECT seq FROM flowcontrol_parked ORDER BY seq LIMIT 2 FOR UPDATE"))
            # SKIP LOCKED: this claim neither waits for it nor takes its rows.
            assert ids(store.claim_due(now=T0)) == ["t-2", "t-3"]
    finally:
        engine.dispose()
        store.close()


def test_the_due_claim_is_prepared_but_planned_for_each_run_on_postgres(postgres_url: str) -> None:
    """Its best index depends on ``now`` (model.py): a generic plan would use one index whether
    nothing or everything is due. Prepared on its own pool, it is still planned on every run,
    while the relaxed pool's statements keep their cached plans."""
    migrate(postgres_url)
    store = ParkingStore(postgres_url, claim_lease=LEASE)
    try:
        for n in range(8):  # psycopg prepares after 5 runs, PostgreSQL considers a generic plan after 5
            store.park(msg(f"t-{n}", T0 - 1, priority=n % 2))
            store.park(msg(f"later-{n}", T0 + 60))
            assert ids(store.claim_due(now=T0, limit=1)) == [f"t-{n}"]
            assert store.done(f"t-{n}") == 1
        plans = "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE starts_with(statement, 'UPDATE')"
        assert store.db.planned is not None
        with store.db.planned.connect() as conn:
            assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar() == "force_custom_plan"
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "off"  # a lease, relaxed
            assert [tuple(row) for row in conn.exec_driver_sql(plans)] == [(0, 8)]
        _, relaxed = store.db.engines()
        with relaxed.connect() as conn:
            assert conn.exec_driver_sql("SHOW plan_cache_mode").scalar() == "auto"
            # No index holds claimed_until, so a lease changes no indexed column: a HOT update.
            indexes = sa.inspect(conn).get_indexes("flowcontrol_parked")
            assert indexes and not [ix for ix in indexes if "claimed_until" in ix["column_names"]]
        assert ids(store.claim_due(now=T0 + 60, limit=10)) == [f"later-{n}" for n in range(8)]
    finally:
        store.close()


@pytest.mark.parametrize("returning", [True, False], ids=["sqlalchemy-returning", "select-then-update"])
def test_the_portable_sqlalchemy_path(store: ParkingStore, returning: bool) -> None:
    """What other databases run: SQLAlchemy Core statements, and without UPDATE ... RETURNING
    a select-then-update claim. (SQLite and PostgreSQL normally take the driver-level fast path.)"""
    store.db.use_fast_path = False
    store.db.use_returning = returning
    assert store.park(msg("a", T0 - 2)) is True and store.park(msg("a", T0 - 2)) is False
    store.park(msg("b", T0 - 1, priority=1))
    store.park(msg("later", T0 + 5))
    claimed = store.claim_due(now=T0)
    assert ids(claimed) == ["b", "a"] and all(m.attempts == 1 and m.claimed_until == T0 + LEASE for m in claimed)
    assert store.claim_due(now=T0) == []
    assert seq_of(store, "a") < seq_of(store, "b")
    assert store.claim("later", now=T0) is not None and store.claim("later", now=T0) is None
    assert store.unclaim(["a", "later"], wake_at=T0 + 20) == 2
    assert ids(store.claim_due(now=T0 + 19)) == []  # b is still held, a and later not due yet
    assert ids(store.claim_due(now=T0 + 20)) == ["a", "later"]
    assert store.unclaim("b") == 1
    assert store.done(["a", "b", "later", "missing"]) == 3 and store.count() == 0


# -- durability settings ---------------------------------------------------------------------------


def test_park_commits_durably_and_wakes_commit_relaxed(store: ParkingStore) -> None:
    durable, relaxed = store.db.engines()
    expected: tuple[Any, Any]
    if store.dialect == "sqlite":
        query, expected = "PRAGMA synchronous", (2, 1)  # FULL, NORMAL
        with durable.connect() as conn:
            conn.execution_options(flowcontrol_read_only=True)
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    else:
        query, expected = "SHOW synchronous_commit", ("on", "off")
    # Read-only transactions: two BEGIN IMMEDIATEs on one SQLite file would wait for each other.
    with durable.connect() as conn, relaxed.connect() as lax:
        conn.execution_options(flowcontrol_read_only=True)
        lax.execution_options(flowcontrol_read_only=True)
        assert (conn.exec_driver_sql(query).scalar(), lax.exec_driver_sql(query).scalar()) == expected


# -- migrations ----------------------------------------------------------------------------------


def table_names(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrate_creates_the_tables_and_is_idempotent(db_url: str) -> None:
    assert table_names(db_url) == set()
    migrate(db_url)
    tables = {"flowcontrol_parked", "flowcontrol_dead", "flowcontrol_woken", VERSION_TABLE}
    assert table_names(db_url) == tables
    migrate(db_url)  # nothing to do, no error
    assert table_names(db_url) == tables
    store = ParkingStore(db_url, create=False)
    assert store.park(msg("t-1")) is True
    store.close()


def test_create_true_migrates_on_first_use(db_url: str) -> None:
    store = ParkingStore(db_url, create=True)
    assert store.park(msg("t-1")) is True
    assert table_names(db_url) == {"flowcontrol_parked", "flowcontrol_dead", "flowcontrol_woken", VERSION_TABLE}
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            assert current_revisions(conn) == {"0003_woken_table"}
    finally:
        engine.dispose()
        store.close()


def test_migrate_logs_the_upgrade_not_alembics_plugin_set_up(sqlite_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    migrate(sqlite_url)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("alembic")]
    assert any(line.startswith("Running upgrade") for line in lines), lines
    assert not any(line.startswith("setup plugin") for line in lines), lines
    assert logging.getLogger(PLUGIN_LOGGER).level == logging.NOTSET  # given back as it was


def test_migrated_schema_matches_the_model(db_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    migrate(db_url)
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            opts = {"version_table": VERSION_TABLE, "include_object": include_object(conn.dialect.name)}
            context = MigrationContext.configure(conn, opts=opts)
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def migrate_at_once(url: str, openers: int) -> list[BaseException]:
    """Run ``migrate(url)`` in *openers* threads at once; what they raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate(url)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=50)
    return errors


def test_concurrent_migrations_serialise(db_url: str) -> None:
    assert migrate_at_once(db_url, 3) == []
    assert "flowcontrol_parked" in table_names(db_url)


def test_processes_opening_a_new_sqlite_database_at_once_all_get_in(tmp_path: Any) -> None:
    """Workers starting together on the SQLite default: the switch to WAL fails at once, with no
    busy wait, while another connection holds a lock ("database is locked" in 3 of 30 rounds
    before engine.py's _use_wal retried it). Every round, every opener gets in."""
    for n in range(12):
        url = f"sqlite:///{tmp_path / f'new{n}.sqlite3'}"
        assert migrate_at_once(url, 4) == [], f"round {n}"
        assert "flowcontrol_parked" in table_names(url)


def test_sqlite_creates_its_tables_on_first_use_and_memory_works(sqlite_url: str) -> None:
    store = ParkingStore(sqlite_url)
    assert store.count() == 0 and VERSION_TABLE in table_names(sqlite_url)
    memory = ParkingStore("sqlite://")
    assert memory.park(msg("t-1")) is True and memory.get("t-1") is not None
    memory.close()
    store.close()


# -- outages -------------------------------------------------------------------------------------


def test_an_unreachable_database_is_an_outage_and_nothing_is_acked(tmp_path: Any) -> None:
    store = ParkingStore(UNREACHABLE_PG)
    # park() raises, so the caller never gets to ack: the message stays in the broker.
    with pytest.raises(ParkingUnavailableError) as caught:
        store.park(msg("t-1"))
    assert isinstance(caught.value.__cause__, sa.exc.OperationalError)
    assert "127.0.0.1:1" in str(caught.value)
    for call in (store.claim_due, store.count, store.counts, lambda: store.done(["t-1"])):
        with pytest.raises(ParkingUnavailableError):
            call()
    with pytest.raises(ParkingUnavailableError):
        migrate(UNREACHABLE_PG)
    nowhere = ParkingStore(f"sqlite:///{tmp_path}/no/such/dir/parking.sqlite3")
    with pytest.raises(ParkingUnavailableError):
        nowhere.park(msg("t-1"))


def test_a_sqlite_file_locked_too_long_is_an_outage(sqlite_url: str) -> None:
    store = ParkingStore(sqlite_url, timeout=0.2)
    store.count()  # tables created
    blocker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # another writer that doesn't let go
        started = time.monotonic()
        with pytest.raises(ParkingUnavailableError, match="database is locked"):
            store.park(msg("t-1"))
        assert time.monotonic() - started < 5
        blocker.execute("ROLLBACK")
        assert store.park(msg("t-1")) is True
    finally:
        blocker.close()
        store.close()


def test_a_postgres_restart_costs_no_error(postgres_url: str, postgres_schema: str) -> None:
    """Connections killed under the pool (a server restart) are replaced on the next call."""
    migrate(postgres_url)
    store = ParkingStore(postgres_url)
    assert store.park(msg("t-1")) is True
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as admin:
            killed = admin.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE application_name = :name AND pid <> pg_backend_pid()"
                ),
                {"name": postgres_schema},
            ).scalar()
        assert killed and killed >= 1
        assert store.park(msg("t-2")) is True
        assert store.count() == 2
    finally:
        engine.dispose()
        store.close()
