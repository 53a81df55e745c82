"""A worker instance's sweeps read the queues where it holds slots or waits (worker/holdings.py),
not every registered queue; the beat task's pass still reaches every queue.

- The gate records each queue it asks admission in; the index forgets one after its horizon.
- A lapsed instance's slots are freed in the sweeping instance's queues by its own chores, and
  in all the others by the pass over every queue (``flowcontrol.reclaim``), on real Redis.
- After a Redis restart (state lost), one re-assertion pass re-creates the configured queues
  and restores exactly the slots the instance holds; a pass with nothing lost makes one script
  call per held queue for the heartbeat and one for the re-assertion, whatever is registered.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.admission.base import Admitted, Ticket
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.testing import FakeClock
from celery_flowcontrol.worker.holdings import Holdings
from celery_flowcontrol.worker.ledger import Admission, Entry, Ledger
from celery_flowcontrol.worker.reassert import Reasserter
from tests.support.messages import TASK, make_gate, make_waker, message
from tests.support.services import RedisServer

pytestmark = pytest.mark.timeout(120)


def evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_the_gate_records_where_it_asked_and_the_index_forgets_after_its_horizon(
        store: ParkingStore) -> None:
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    gate = make_gate(backend, store)
    holdings = Holdings(gate.ledger)
    assert holdings.queues() == []
    gate.on_message(message(), TASK, lambda: None)  # admitted: a slot in the ledger
    assert holdings.held() == ["api"] and holdings.queues() == ["api"]
    gate.on_message(message(), TASK, lambda: None)  # denied and parked: a waiter
    gate.ledger.drain()  # the running task is gone: its waiter is left
    assert holdings.held() == [] and holdings.queues() == ["api"]

    clock = FakeClock()
    holdings = Holdings(Ledger(clock), horizon=10)
    holdings.ledger.asked("a")
    clock.advance(5)
    holdings.ledger.asked("b")
    assert holdings.queues() == ["a", "b"]
    clock.advance(7)
    assert holdings.queues() == ["b"], "asked more than the horizon ago: forgotten"
    assert holdings.ledger.asked_since(0) == ["b"]


def test_a_lapsed_instance_is_reclaimed_here_by_a_worker_and_everywhere_by_the_beat_pass(
        redis_client: redis.Redis, key_prefix: str, store: ParkingStore) -> None:
    clock = FakeClock()
    backend = RedisBackend(redis_client, key_prefix=key_prefix, clock=clock)
    try:
        names = [f"q{i}" for i in range(300)]
        for name in names:
            backend.register(QueueConfig(name, concurrency=1))
        dead = backend.try_admit_many([Ticket(n, f"d-{n}", "dead") for n in names])
        assert all(isinstance(d, Admitted) for d in dead)
        holdings = Holdings(Ledger())
        for name in names[:3]:  # this worker waits in three of them
            assert not backend.try_admit(Ticket(name, f"w-{name}", "w1")).admitted
            holdings.ledger.asked(name)
        clock.advance(backend.instance_ttl + 1)
        waker = make_waker(backend, store, instance="w1", reclaim_every=0, clock=clock,
                           holdings=holdings)
        waker._chores()  # the heartbeat, its reclaim pass and its grant rescue: its queues only
        assert sorted(g.task_id for g in backend.pending_grants()) == [f"w-{n}" for n in names[:3]]
        assert sum(backend.stats(n).in_use for n in names) == 297, "the rest are not its sweep's"
        report = backend.reclaim()  # what flowcontrol.reclaim runs: every registered queue
        assert report.instances == 297
        assert sum(backend.stats(n).in_use for n in names) == 0
    finally:
        backend.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path).start()
    yield s
    s.stop()


def test_a_restart_reasserts_exactly_what_the_instance_holds(server: RedisServer) -> None:
    client = server.client()
    backend = RedisBackend(server.client(), key_prefix="fc")
    try:
        configured = [QueueConfig(f"q{i}", concurrency=2) for i in range(200)]
        for config in configured:
            backend.register(config)
        ledger = Ledger()
        mine: list[Any] = []
        for i, name in enumerate(["q7", "q8", "q8", "q150"]):
            d = backend.try_admit(Ticket(name, f"t{i}", "me"))
            assert isinstance(d, Admitted)
            ledger.add((f"t{i}", 1), Admission(entries=[Entry(d.slot, False)]))
            mine.append(d.slot.slot_id)
        assert backend.try_admit(Ticket("q9", "theirs", "other")).admitted
        holdings = Holdings(ledger)
        reassert = Reasserter(backend=backend, instance="me", ledger=ledger,
                              configured=configured, config_of=lambda name: None,
                              holdings=holdings)
        reassert.heartbeat()
        assert reassert.reassert() == 0, "nothing forgotten"
        before = evalsha_calls(client)  # the scripts are loaded now: every call counts once
        reassert.heartbeat()
        assert reassert.reassert() == 0
        assert evalsha_calls(client) - before == 3 + 3, "one heartbeat and one restore a held queue"

        server.restart()  # without persistence: every key is gone
        backend.client.connection_pool.disconnect()
        client.connection_pool.disconnect()
        assert backend.queues() == []
        assert reassert.reassert() == 4, "the configured queue whose turn it was is gone: all restored"
        assert backend.queues() == sorted(c.name for c in configured)
        busy = {s.slot_id: s.holder for c in configured for s in backend.busy_slots(c.name)}
        assert busy == dict.fromkeys(mine, "me"), "exactly what it holds, no more"
        assert reassert.reassert() == 0, "once per loss"
    finally:
        backend.close()
        client.close()
