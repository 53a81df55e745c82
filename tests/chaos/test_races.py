"""The interleavings the chaos runs found, replayed exactly in one process (real SQLite
parking, the in-process backend, real kombu messages), so each has a deterministic test."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkingStore, migrate
from celery_flowcontrol.parking.store import PARKED, WOKEN
from celery_flowcontrol.worker.gate import Outcome
from celery_flowcontrol.worker.message import WOKEN_HEADER
from tests.support.messages import TASK, make_gate, message


def test_a_woken_copy_denied_while_the_waker_deletes_its_row_is_not_acked(tmp_path: Path) -> None:
    """The race of a task lost in the kill -9 chaos run (PostgreSQL parking):

    waker: claim_due -> [t]; republish t; ...            gate (consumer thread, same node):
                                                         copy of t denied; park(t) conflicts
    waker: done([t]) deletes the row                      (the row still existed)
                                                         the park's look at the row: none
                                                         ack: the only copy of t is gone

    The copy must not be acked when its row vanished between the insert and the check: it
    is the live message now (park it again, or defer it)."""
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    store = ParkingStore(f"sqlite:///{tmp_path / 'park.sqlite3'}")
    gate = make_gate(backend, store)
    assert gate.on_message(message(id="holder"), TASK, lambda: None) is Outcome.RUN
    assert gate.on_message(message(id="t"), TASK, lambda: None) is Outcome.PARKED
    (claimed,) = store.claim_due(now=time.time() + 3600)  # the waker takes the row ...
    real_park = store.park

    waker_done: list[str] = []

    def park_then_the_waker_finishes(m: Any) -> bool:
        parked = real_park(m)
        if not waker_done:  # ... and deletes it, once, right after this insert conflicted
            waker_done.append(claimed.task_id)
            store.done([claimed.task_id])
        return parked

    store.park = park_then_the_waker_finishes  # type: ignore[method-assign]
    acks: list[bool] = []
    outcome = gate.on_message(message(id="t"), TASK, lambda: acks.append(True))
    store.park = real_park  # type: ignore[method-assign]
    kept = store.get("t") is not None
    store.close()
    assert outcome is Outcome.DEFER or kept, (
        f"the last copy of t was acked ({outcome}, acks={acks}) with no row left: lost")


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh parking database: a SQLite file, or a PostgreSQL schema of this test's own
    (migrated)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'park.sqlite3'}"
    url = str(request.getfixturevalue("postgres_url"))
    migrate(url)
    return url


def _parked_then_crashed(tmp_path: Path, url: str | None = None, *, release: bool = True
                         ) -> tuple[Any, ParkingStore, Any, str]:
    """Cap 1 held by ``holder``; ``t`` denied and its row committed, the node dead before the
    ack; the holder's slot released (granted to ``t``) unless not *release*. A fresh gate
    meets ``t`` again."""
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    store = ParkingStore(url or f"sqlite:///{tmp_path / 'park.sqlite3'}")
    gate = make_gate(backend, store)
    assert gate.on_message(message(id="holder"), TASK, lambda: None) is Outcome.RUN
    assert gate.on_message(message(id="t"), TASK, lambda: None) is Outcome.PARKED  # ack lost
    if release:
        backend.release(gate.ledger.get(("holder", next(iter(gate.ledger.items()))[0][1])).primary)
    again = message(id="t")
    again.delivery_info["redelivered"] = True
    return backend, store, again, "t"


def _woken(store: ParkingStore, tid: str, *, delete: bool = True) -> Any:
    """A waker wakes *tid*'s row all the way (claim, publish, delete; without *delete* it dies
    before the delete): the copy it published."""
    (row,) = store.claim_many([tid])
    if delete:
        store.wakes.record([row], [tid])
    return message(id=tid, **{WOKEN_HEADER: {"row": row.seq, "wake": row.attempts}})


def test_a_redelivery_that_finds_its_row_waiting_runs_once(tmp_path: Path) -> None:
    """The node died between a park's commit and its ack: the broker's second copy is
    admitted (the slot granted to its ticket) and takes its row out, so the row never wakes
    to run the task a second time."""
    backend, store, again, tid = _parked_then_crashed(tmp_path)
    acks: list[bool] = []
    outcome = make_gate(backend, store, instance="w2").on_message(again, TASK, lambda: acks.append(True))
    assert outcome is Outcome.RUN and not acks
    assert store.get(tid) is None and store.claim_due(now=time.time() + 3600) == []
    store.close()


def test_a_redelivery_whose_row_is_being_woken_is_acked_unrun(tmp_path: Path) -> None:
    """As above, but a waker leased the row first: its woken copy is the one to run; the
    second copy is acked without running (and gives back the slot it was admitted to)."""
    backend, store, again, tid = _parked_then_crashed(tmp_path)
    assert [m.task_id for m in store.claim_many([tid])] == [tid]
    acks: list[bool] = []
    gate = make_gate(backend, store, instance="w2")
    outcome = gate.on_message(again, TASK, lambda: acks.append(True))
    assert outcome is Outcome.PARKED and acks == [True]
    assert store.get(tid) is not None and not gate.ledger.held()
    assert backend.stats("api").in_use == 0
    store.close()


# -- the commit-then-ack window: the broker's second copy and a row a waker woke -------------
#
# waker: claim t's row; publish its copy; delete it     the broker's second copy of t (its node
#        (remembered as woken), all before ...           died between the park's commit and ack)
#                                                        ... is decided: it must not run too


def test_an_admitted_redelivery_whose_row_was_woken_already_is_acked_unrun(tmp_path: Path, db_url: str) -> None:
    backend, store, again, tid = _parked_then_crashed(tmp_path, db_url)
    copy = _woken(store, tid)
    gate = make_gate(backend, store, instance="w2")
    acks: list[bool] = []
    assert gate.on_message(again, TASK, lambda: acks.append(True)) is Outcome.PARKED and acks == [True]
    assert not gate.ledger.held() and backend.stats("api").in_use == 0  # its slot given back
    assert gate.on_message(copy, TASK, lambda: None) is Outcome.RUN  # the woken copy: the one run
    assert store.get(tid) is None
    store.close()


@pytest.mark.parametrize("waker", ["leased", "woken"])
def test_a_denied_redelivery_whose_row_a_waker_took_is_acked_unrun(tmp_path: Path, db_url: str,
                                                                    waker: str) -> None:
    """Denied (the cap still held), the second copy must neither wait for the row (a
    deferral, then a row of its own once the waker deletes the first) nor park again."""
    backend, store, again, tid = _parked_then_crashed(tmp_path, db_url, release=False)
    if waker == "leased":
        assert [m.task_id for m in store.claim_many([tid])] == [tid]
    else:
        _woken(store, tid)
    acks: list[bool] = []
    outcome = make_gate(backend, store, instance="w2").on_message(again, TASK, lambda: acks.append(True))
    assert outcome is Outcome.PARKED and acks == [True]
    row = store.get(tid)
    assert (row is not None and row.claimed_until is not None) if waker == "leased" else row is None
    store.close()


def test_the_woken_copy_delivered_again_runs(tmp_path: Path) -> None:
    """A woken copy whose own node died (its run cut) is delivered again: it is not a second
    copy of the row it came from, and runs again, as Celery runs any message it redelivers."""
    backend, store, _, tid = _parked_then_crashed(tmp_path)
    copy = _woken(store, tid)
    copy.delivery_info["redelivered"] = True
    acks: list[bool] = []
    assert make_gate(backend, store, instance="w2").on_message(copy, TASK, lambda: acks.append(True)) is Outcome.RUN
    assert not acks
    store.close()


@pytest.mark.parametrize("then", ["taken over", "woken again"])
def test_the_copy_of_a_wake_whose_waker_died_runs_once(tmp_path: Path, db_url: str, then: str) -> None:
    """A waker died between its publish and its delete (crash point wake.published), and the
    node its copy ran on died too: the copy, delivered again, waits while that wake holds the
    row's lease, then either takes the row over (its lease ran out) or, the row woken again by
    another waker meanwhile, is acked unrun (the new wake's copy runs)."""
    backend, store, _, tid = _parked_then_crashed(tmp_path, db_url)
    copy = _woken(store, tid, delete=False)
    copy.delivery_info["redelivered"] = True
    gate = make_gate(backend, store, instance="w2")
    acks: list[bool] = []
    assert gate.on_message(copy, TASK, lambda: acks.append(True)) is Outcome.DEFER and not acks
    assert backend.stats("api").in_use == 0  # it holds nothing while it waits
    store.unclaim([tid])  # the dead waker's lease runs out
    if then == "woken again":
        newer = _woken(store, tid)
        assert gate.on_message(copy, TASK, lambda: acks.append(True)) is Outcome.PARKED and acks == [True]
        assert gate.on_message(newer, TASK, lambda: None) is Outcome.RUN
    else:
        assert gate.on_message(copy, TASK, lambda: acks.append(True)) is Outcome.RUN and not acks
    assert store.get(tid) is None
    store.close()


def test_a_redelivery_parked_while_a_waker_deletes_its_row_sees_the_wake(db_url: str) -> None:
    """The denied second copy's insert waits for the waker's delete (the row's unique task id
    is still held by it) and then goes in: the look at the woken rows in the same transaction
    sees what that delete remembered, so the copy is not stored (not a second row to run)."""
    store = ParkingStore(db_url)
    first, _, _, _ = _parked_then_crashed_row(store)
    engine = sa.create_engine(db_url)
    result: list[Any] = []
    try:
        with engine.connect() as waker:
            deleting = waker.begin()  # the waker's delete, not committed yet
            waker.execute(sa.delete(PARKED).where(PARKED.c.task_id == "t"))
            waker.execute(sa.insert(WOKEN).values(task_id="t", ticket="t", seq=first.seq, attempts=1,
                                                  woken_at=time.time()))
            parking = threading.Thread(target=lambda: result.append(store.wakes.park_again(first, "t", None)))
            parking.start()
            time.sleep(0.3)  # let it reach the insert (the outcome does not depend on it)
            deleting.commit()
            parking.join(30)
        assert result == [None] and store.get("t") is None
    finally:
        engine.dispose()
        store.close()


def _parked_then_crashed_row(store: ParkingStore) -> tuple[Any, ...]:
    """``t``'s row, parked (the message it keeps is the one the broker delivers again)."""
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    gate = make_gate(backend, store)
    assert gate.on_message(message(id="holder"), TASK, lambda: None) is Outcome.RUN
    assert gate.on_message(message(id="t"), TASK, lambda: None) is Outcome.PARKED
    row = store.get("t")
    assert row is not None
    return row, backend, gate, store
