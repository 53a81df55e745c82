"""The drainer's decisions (worker/drain.py), on fakes of the broker's lists and the store.

The story: a bulk taken off the broker is asked for in one call; the denied ones are committed
in one transaction and only then acked; what the batch did not store, what admission let in
(its slot released at once), an unknown task or another queue's message go back to the
consumer, oldest first; a commit that fails, or a bug, gives everything back and acks nothing;
the drainer drains only flooded queues whose backlog belongs in the parking table (ordered, or
a line that stands still), and not again until a queue was parked in after it stopped there.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from kombu import Connection
from kombu.message import Message

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.admission.base import Ticket
from celery_flowcontrol.config import QueueConfig, RateLimit
from celery_flowcontrol.errors import ParkingUnavailableError
from celery_flowcontrol.kombu_redis import BrokerLists, Taken
from celery_flowcontrol.worker import drain as drain_module
from celery_flowcontrol.worker.drain import Drainer, Floods
from celery_flowcontrol.worker.ledger import Ledger


class Lists:
    """The broker's lists: what ``take`` hands out, and what came back or was acked."""

    def __init__(self, taken: list[Taken], log: list[str]) -> None:
        self.taken, self.log = taken, log
        self.back: list[Taken] = []
        self.acked: list[Taken] = []

    def take(self, queues: Any, most: int, allowed: Any) -> list[Taken]:
        out, self.taken = self.taken[:most], self.taken[most:]
        return out

    def to_message(self, t: Taken) -> Any:
        p = t.payload
        return Message(body=b"[[], {}, {}]", delivery_tag=t.tag, headers=p["headers"],
                       properties={"priority": 0}, delivery_info={"exchange": "", "routing_key": "q"},
                       content_type="application/json", content_encoding="utf-8")

    def give_back(self, taken: list[Taken]) -> int:
        self.log.append("give_back")
        self.back += taken
        return len(taken)

    def ack(self, taken: list[Taken]) -> None:
        self.log.append("ack")
        self.acked += taken


class Store:
    def __init__(self, log: list[str], results: Any = None) -> None:
        self.log, self.results, self.rows = log, results, []

    def park_many(self, rows: list[Any]) -> list[Any]:
        self.log.append("commit")
        if isinstance(self.results, Exception):
            raise self.results
        self.rows += rows
        return self.results(rows) if self.results else [True] * len(rows)


def taken_of(n: int, queue: str = "q", task: str = "proj.work") -> Taken:
    tid = f"t{n}"
    return Taken("list", f"tag{n}", "{}", {"headers": {"id": tid, "task": task, "flow_queue": queue,
                                                       "root_id": tid}})


def drainer(store: Store, backend: MemoryBackend, ordered: bool = True,
            moving: bool = True) -> tuple[Drainer, Any, list[str]]:
    parker = SimpleNamespace(stored=[], committed=[])
    parker_part = SimpleNamespace(stored=parker.stored.append, committed=parker.committed.extend)
    released: list[str] = []
    releases = SimpleNamespace(release=lambda slot_id, queue=None, then=None: (
        released.append(slot_id), backend.release(slot_id)))
    lingering = SimpleNamespace(drains=lambda q, config: ordered, moving=lambda q: moving,
                                seen=lambda opts: None, moved=lambda q: None)
    d = Drainer(floods=Floods(), tasks={"proj.work": SimpleNamespace(name="proj.work")},
                backend=backend, store=store, parker=parker_part, releases=releases,  # type: ignore[arg-type]
                ledger=Ledger(), lingering=lingering, configs=lambda q: None,  # type: ignore[arg-type]
                instance="i1", clock=time.time, most=5)
    return d, SimpleNamespace(parker=parker, released=released), released


@pytest.fixture
def backend() -> MemoryBackend:
    b = MemoryBackend()
    b.register(QueueConfig("q", concurrency=1))
    b.register(QueueConfig("other", concurrency=1))
    b.try_admit(Ticket("q", "holder", "i0"))  # the one slot is busy: every ticket waits
    return b


def test_denied_messages_are_committed_together_then_acked(backend: MemoryBackend) -> None:
    log: list[str] = []
    store = Store(log)
    d, seen, _ = drainer(store, backend)
    lists = Lists([taken_of(i) for i in range(5)], log)
    stop = d.step(lists, ["q"])  # type: ignore[arg-type]
    assert log == ["commit", "ack"], "acked only once committed, all in one round trip each"
    assert [r.task_id for r in store.rows] == [f"t{i}" for i in range(5)]
    assert [t.tag for t in lists.acked] == [f"tag{i}" for i in range(5)] and not lists.back
    assert [r.task_id for r in seen.parker.stored] == [f"t{i}" for i in range(5)]
    assert len(seen.parker.committed) == 5 and d.drained == 5
    assert stop == set(), "a full bulk: the queue is drained on"
    assert [w.task_id for w in backend.waiters("q")] == [f"t{i}" for i in range(5)]
    assert all(r.reason == "concurrency" for r in store.rows)


def test_what_the_batch_did_not_store_goes_back_oldest_first(backend: MemoryBackend) -> None:
    log: list[str] = []
    store = Store(log, results=lambda rows: [r.task_id not in ("t1", "t3") for r in rows])
    d, _, _ = drainer(store, backend)
    taken = [taken_of(0), taken_of(1), taken_of(2, task="proj.unknown"), taken_of(3)]
    lists = Lists(taken, log)
    stop = d.step(lists, ["q"])  # type: ignore[arg-type]
    assert [t.tag for t in lists.acked] == ["tag0"]
    assert [t.tag for t in lists.back] == ["tag1", "tag2", "tag3"], "in the order taken"
    assert log == ["commit", "ack", "give_back"]
    assert stop == {"q"}, "a short bulk: the tail is not the queue's any more"


def test_an_admission_releases_its_slot_gives_the_message_back_and_stops(backend: MemoryBackend) -> None:
    log: list[str] = []
    store = Store(log)
    d, _, released = drainer(store, backend)
    backend.release(backend.busy_slots("q")[0].slot_id)  # the line is short now
    lists = Lists([taken_of(i) for i in range(5)], log)
    stop = d.step(lists, ["q"])  # type: ignore[arg-type]
    assert len(released) == 1 and [t.tag for t in lists.back] == ["tag0"]
    assert [t.tag for t in lists.acked] == [f"tag{i}" for i in range(1, 5)]
    assert backend.stats("q").in_use == 0 or backend.stats("q").granted == 1, \
        "the slot went back (to the next waiter)"
    assert stop == {"q"}


def test_a_commit_that_fails_acks_nothing_and_gives_all_back(
        backend: MemoryBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain_module, "BACK_OFF", 0.0)
    log: list[str] = []
    d, seen, _ = drainer(Store(log, ParkingUnavailableError("down")), backend)
    lists = Lists([taken_of(i) for i in range(5)], log)
    assert d.step(lists, ["q"]) == {"q"}  # type: ignore[arg-type]
    assert lists.acked == [] and [t.tag for t in lists.back] == [f"tag{i}" for i in range(5)]
    assert seen.parker.stored == [] and d.drained == 0


def test_a_cost_no_admission_takes_gives_the_bulk_back_quietly(
        backend: MemoryBackend, caplog: pytest.LogCaptureFixture) -> None:
    backend.register(QueueConfig("q", concurrency=1, rate_limit=RateLimit(2, 60, per="cost")))
    log: list[str] = []
    d, seen, _ = drainer(Store(log), backend)
    costly = taken_of(2)
    costly.payload["headers"]["flow_cost"] = 5
    lists = Lists([taken_of(0), taken_of(1), costly], log)
    with caplog.at_level("WARNING", logger="celery_flowcontrol"):
        assert d.step(lists, ["q"]) == {"q"}  # type: ignore[arg-type]
    assert [t.tag for t in lists.back] == ["tag0", "tag1", "tag2"], "all back, oldest first"
    assert lists.acked == [] and log == ["give_back"] and d.drained == 0
    assert not caplog.records, "not an outage: the consumer's path dead-letters the cost"


def test_a_bug_mid_step_gives_everything_back(backend: MemoryBackend) -> None:
    log: list[str] = []
    d, _, _ = drainer(Store(log, RuntimeError("bug")), backend)
    lists = Lists([taken_of(i) for i in range(3)], log)
    with pytest.raises(RuntimeError):
        d.step(lists, ["q"])  # type: ignore[arg-type]
    assert lists.acked == [] and [t.tag for t in lists.back] == ["tag0", "tag1", "tag2"]


def test_another_queues_message_goes_back(backend: MemoryBackend) -> None:
    log: list[str] = []
    d, _, _ = drainer(Store(log), backend)
    lists = Lists([taken_of(0), taken_of(1, queue="other")], log)
    d.step(lists, ["q"])  # type: ignore[arg-type]
    assert [t.tag for t in lists.back] == ["tag1"] and [t.tag for t in lists.acked] == ["tag0"]


def test_a_bulk_that_parks_nothing_stops_the_drain(backend: MemoryBackend) -> None:
    log: list[str] = []
    d, _, _ = drainer(Store(log, results=lambda rows: [False] * len(rows)), backend)
    lists = Lists([taken_of(i) for i in range(5)], log)
    assert d.step(lists, ["q"]) == {"q"}, "what went back is the consumer's first"  # type: ignore[arg-type]
    assert len(lists.back) == 5 and lists.acked == []


def test_only_flooded_queues_are_drained_whose_backlog_belongs_in_parking(backend: MemoryBackend) -> None:
    d, _, _ = drainer(Store([]), backend)
    d._lists = object()  # type: ignore[assignment]  # attached
    assert d._queues() == []
    d.floods.parked("q")
    assert d.floods.event.is_set() and d._queues() == ["q"]
    d._stopped["q"] = time.monotonic()
    assert d._queues() == [], "stopped there: not until it is parked in again"
    d.floods.parked("q")
    assert d._queues() == ["q"]
    fifo, _, _ = drainer(Store([]), backend, ordered=False)
    fifo._lists = object()  # type: ignore[assignment]
    fifo.floods.parked("q")
    assert fifo._queues() == [], "a FIFO queue whose line moves keeps its backlog in the broker"
    stalled, _, _ = drainer(Store([]), backend, ordered=False, moving=False)
    stalled._lists = object()  # type: ignore[assignment]
    stalled.floods.parked("q")
    assert stalled._queues() == ["q"], "a line that stands still: drained"


@pytest.mark.parametrize("url", ["memory://", "filesystem://"])
def test_other_transports_have_no_lists_to_drain(url: str, tmp_path: Any) -> None:
    options = {"data_folder_in": str(tmp_path), "data_folder_out": str(tmp_path)} \
        if url.startswith("filesystem") else {}
    with Connection(url, transport_options=options) as conn:
        assert BrokerLists.of(conn.channel(), ["q"]) is None, "the consumer's path is the drain"
