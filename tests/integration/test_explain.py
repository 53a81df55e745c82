"""``explain`` read from the stores a task can be in, on the in-process backend and SQLite.

Each place a task can be (unseen, parked, granted, running, finished) and each reason a row
can carry is explained from the rows and the backend alone, with a hand-moved clock; the
place in line is checked against the order in which the backend then actually admits the
waiters (a property test over random priorities and fairness keys, on the in-process and
the Redis backend). Real workers explain their tasks in tests/e2e/test_why.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_flowcontrol import FlowControl, explain
from celery_flowcontrol.admission import Admitted, MemoryBackend, Ticket
from celery_flowcontrol.parking import ParkedMessage
from celery_flowcontrol.reasons import REASONS, Reason, reason_of

HOLDER = "w1/1/ab"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def env(sqlite_url: str) -> Iterator[Any]:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_parking_url=sqlite_url, flowcontrol_backend=backend,
                    flowcontrol_queues=[
                        {"name": "api", "concurrency": 1},
                        {"name": "fair", "concurrency": 1, "fairness": "key"},
                        {"name": "tenants", "concurrency": 4, "per_key_concurrency": 1},
                        {"name": "slow", "rate_limit": "2/m"},
                        {"name": "keyed", "per_key_rate_limit": "1/m"}])
    fc = FlowControl(app)
    for config in fc.settings.queues:
        backend.register(config)
    yield SimpleNamespace(app=app, fc=fc, backend=backend, clock=clock)
    fc.store.close()


def wait(env: Any, queue: str, task_id: str, *, priority: int = 0, key: str = "",
         reason: str | None = None) -> Any:
    """Ask for *task_id* (denied), and park it with the reason the denial gave."""
    decision = env.backend.try_admit(Ticket(queue, task_id, HOLDER, priority, key))
    assert not decision.admitted
    said = reason_of(reason or decision.reason)
    assert said is not None
    env.fc.store.park(ParkedMessage(task_id=task_id, queue=queue, body=b"{}",
                                    wake_at=decision.retry_at, priority=priority,
                                    fairness_key=key or None, reason=said.value))
    return decision


def test_one_list_of_reasons_with_the_admission_contract_mapped_onto_it() -> None:
    assert REASONS == ("concurrency", "key-concurrency", "rate", "key-rate", "backoff", "paused",
                       "eta", "debounce", "batch", "grant")
    assert reason_of("per_key") is Reason.KEY_CONCURRENCY
    assert reason_of("acquire") is Reason.CONCURRENCY
    assert reason_of("requeued") is None
    assert str(Reason.KEY_RATE) == "key-rate"


def test_an_id_nobody_has_seen_is_unseen_not_an_error(env: Any) -> None:
    out = explain(env.app, "never-sent", timeout=0.2)
    assert out["where"] == "unseen" and out["reason"] is None and out["position"] is None
    assert "unseen" in out["text"]


def test_a_parked_task_has_its_place_what_holds_it_and_by_whom(env: Any) -> None:
    assert isinstance(env.backend.try_admit(Ticket("api", "run", HOLDER)), Admitted)
    wait(env, "api", "a")
    wait(env, "api", "b", priority=5)
    wait(env, "api", "c")
    out = explain(env.app, "c")
    assert out["where"] == "parked" and out["queue"] == "api"
    assert out["reason"] == "concurrency"
    assert (out["position"], out["waiting"]) == (3, 3)
    assert out["ahead"] == {"total": 2, "higher_priority": 1, "other_keys": 0}
    assert out["blocked_by"] == [{"reason": "concurrency", "busy": 1, "granted": 0,
                                  "capacity": 1, "holders": [HOLDER]}]
    assert out["estimated_start"] is None  # a slot: no instant until one is reserved for it
    assert out["text"] == "task c is parked in queue api, 3rd of 3: 1 of 1 slots busy"
    assert explain(env.app, "b")["position"] == 1  # the higher priority is served first


def test_a_wait_for_a_slot_is_estimated_from_the_queue_s_release_rate(env: Any) -> None:
    for i in range(3):  # a slot given back every 10 s
        slot = env.backend.try_admit(Ticket("api", f"done{i}", HOLDER)).slot
        env.clock.now += 10
        env.backend.release(slot.slot_id)
    env.backend.try_admit(Ticket("api", "run", HOLDER))
    wait(env, "api", "a")
    wait(env, "api", "b")
    rate = env.backend.release_rate("api")
    assert 1 / 60 < rate < 0.1  # three releases in 30 s, decaying over RELEASE_TAU = 60 s
    out = explain(env.app, "b")
    assert out["release_rate"] == rate
    assert out["estimated_start"] == pytest.approx(env.clock.now + 2 / rate)
    assert out["text"] == (f"task b is parked in queue api, 2nd of 2: 1 of 1 slots busy; "
                           f"about {2 / rate:.1f}s")
    env.clock.now += 600  # nothing given back for ten minutes: too few to tell
    assert explain(env.app, "b")["estimated_start"] is None


def test_a_freed_slot_granted_to_the_next_waiter_is_granted(env: Any) -> None:
    slot = env.backend.try_admit(Ticket("api", "run", HOLDER)).slot
    wait(env, "api", "a")
    wait(env, "api", "b")
    env.backend.release(slot.slot_id)
    out = explain(env.app, "a")
    assert out["where"] == "granted" and out["reason"] == "grant"
    assert out["estimated_start"] == env.clock.now
    assert "slot is reserved" in out["text"]
    assert explain(env.app, "b")["position"] == 1


def test_a_task_holding_a_slot_is_running_on_its_holder(env: Any) -> None:
    env.backend.try_admit(Ticket("api", "run", HOLDER))
    out = explain(env.app, "run", timeout=0.2)
    assert out["where"] == "running" and out["worker"] == HOLDER and out["queue"] == "api"
    assert out["text"] == f"task run is running on {HOLDER} in queue api"


def test_a_key_at_its_own_cap_is_key_concurrency(env: Any) -> None:
    env.backend.try_admit(Ticket("tenants", "t1", HOLDER, 0, "acme"))
    wait(env, "tenants", "t2", key="acme")
    out = explain(env.app, "t2")
    assert out["reason"] == "key-concurrency" and out["key"] == "acme"
    assert out["blocked_by"] == [{"reason": "key-concurrency", "key": "acme", "busy": 1,
                                  "cap": 1, "holders": [HOLDER]}]
    assert "key acme holds 1 of its 1 slots" in out["text"]


def test_a_full_rate_window_says_until_when(env: Any) -> None:
    for i in range(2):
        env.backend.try_admit(Ticket("slow", f"s{i}", HOLDER))
    d = wait(env, "slow", "late")
    out = explain(env.app, "late")
    assert out["reason"] == "rate" and out["retry_at"] == d.retry_at
    assert out["estimated_start"] == d.retry_at
    assert out["blocked_by"][0]["reason"] == "rate" and out["blocked_by"][0]["until"] == d.retry_at
    assert out["text"].endswith(f"rate limit {out['blocked_by'][0]['limit']} used up; about "
                                f"{d.retry_at - env.clock.now:.1f}s")


def test_a_key_s_own_rate_window_is_key_rate(env: Any) -> None:
    env.backend.try_admit(Ticket("keyed", "k0", HOLDER, 0, "acme"))
    d = wait(env, "keyed", "k1", key="acme")
    out = explain(env.app, "k1")
    assert out["reason"] == "key-rate" and out["estimated_start"] == d.retry_at
    assert "key acme's rate limit is used up" in out["text"]


def test_a_backoff_in_force_says_until_when(env: Any) -> None:
    until = env.backend.backoff("slow", 30)
    wait(env, "slow", "b1")
    out = explain(env.app, "b1")
    assert out["reason"] == "backoff" and out["estimated_start"] == until
    assert {"reason": "backoff", "until": until} in out["blocked_by"]


def test_a_pause_says_whose_and_until_when(env: Any) -> None:
    env.backend.try_admit(Ticket("fair", "run-1", HOLDER, 0, "acme"))
    env.backend.pause("fair", "bigco", env.clock.now + 600)
    d = wait(env, "fair", "held-1", key="bigco")
    assert d.reason == "paused" and d.retry_at == env.clock.now + 600
    out = explain(env.app, "held-1")
    assert out["reason"] == "paused" and out["estimated_start"] == env.clock.now + 600
    assert {"reason": "paused", "key": "bigco", "until": env.clock.now + 600} in out["blocked_by"]
    assert out["text"].endswith("key bigco is paused; about 10m00s"), out["text"]
    env.backend.pause("fair")  # the whole queue, until resumed: nobody knows when
    out = explain(env.app, "held-1")
    assert {"reason": "paused", "key": None, "until": None} in out["blocked_by"]
    assert out["estimated_start"] is None
    assert out["text"].endswith("the queue is paused until resumed"), out["text"]


@pytest.mark.parametrize("reason", ["eta", "debounce"])
def test_a_row_waiting_for_its_instant_says_it(env: Any, reason: str) -> None:
    at = env.clock.now + 42
    env.fc.store.park(ParkedMessage(task_id="t", queue="api", body=b"{}", wake_at=at,
                                    reason=reason))
    out = explain(env.app, "t")
    assert out["where"] == "parked" and out["reason"] == reason
    assert out["estimated_start"] == at and out["text"].endswith("about 42.0s")


def test_a_row_of_an_older_release_speaks_the_new_words(env: Any) -> None:
    env.backend.try_admit(Ticket("tenants", "t1", HOLDER, 0, "acme"))
    env.backend.try_admit(Ticket("tenants", "t2", HOLDER, 0, "acme"))
    env.fc.store.park(ParkedMessage(task_id="t2", queue="tenants", body=b"{}", wake_at=2e9,
                                    fairness_key="acme", reason="per_key"))
    assert explain(env.app, "t2")["reason"] == "key-concurrency"


_ids = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(waiters=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["", "a", "b", "c"])),
                        min_size=1, max_size=12),
       queue=st.sampled_from(["api", "fair"]))
def test_the_explained_places_are_the_order_tasks_then_start(env: Any, waiters: list[Any],
                                                             queue: str) -> None:
    run = f"run{next(_ids)}"
    slot = env.backend.try_admit(Ticket(queue, run, HOLDER)).slot
    ids = []
    for priority, key in waiters:
        task_id = f"t{next(_ids)}"
        wait(env, queue, task_id, priority=priority, key=key)
        ids.append(task_id)
    places = {t: explain(env.app, t)["position"] for t in ids}
    assert sorted(places.values()) == list(range(1, len(ids) + 1))
    started = []
    for _ in ids:  # each freed slot goes to the next waiter, which comes back and starts
        env.backend.release(slot.slot_id)
        (grant,) = env.backend.pending_grants(queue)
        slot = env.backend.try_admit(Ticket(queue, grant.task_id, HOLDER)).slot
        env.fc.store.delete(grant.task_id)  # woken: its row goes
        started.append(grant.task_id)
    env.backend.release(slot.slot_id)
    assert started == sorted(ids, key=places.__getitem__)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(waiters=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["", "a", "b", "c"])),
                        min_size=1, max_size=20),
       fairness=st.sampled_from(["fifo", "key"]), order=st.sampled_from(["fifo", "lifo"]))
def test_the_redis_place_is_the_served_order_without_listing_it(
        redis_client: Any, key_prefix: str, waiters: list[Any], fairness: str, order: str) -> None:
    from celery_flowcontrol.admission import RedisBackend
    from celery_flowcontrol.config import QueueConfig

    backend = RedisBackend(redis_client, key_prefix=key_prefix)
    name = f"q{next(_ids)}"
    backend.register(QueueConfig(name, concurrency=1, fairness=fairness, order=order))
    backend.try_admit(Ticket(name, "run", HOLDER))
    for i, (priority, key) in enumerate(waiters):
        backend.try_admit(Ticket(name, f"t{i}", HOLDER, priority, key))
    line = backend.waiters(name, len(waiters))
    for n, w in enumerate(line, 1):
        ahead = line[:n - 1]
        place = backend.place(name, w.task_id)
        assert place is not None and place.position == n
        assert place.higher_priority == sum(a.priority > w.priority for a in ahead)
        turns = fairness == "key"  # else one line: no turn is a key's
        assert place.other_keys == (sum(a.fairness_key != w.fairness_key for a in ahead) if turns else 0)
    assert backend.place(name, "not-waiting") is None


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(waiters=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["", "a", "b", "c"])),
                        min_size=1, max_size=12),
       fairness=st.sampled_from(["fifo", "key"]))
def test_on_redis_the_explained_places_are_the_order_tasks_then_start(
        redis_client: Any, key_prefix: str, sqlite_url: str, waiters: list[Any], fairness: str) -> None:
    from celery_flowcontrol.admission import RedisBackend
    from celery_flowcontrol.config import QueueConfig

    backend = RedisBackend(redis_client, key_prefix=key_prefix)
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_parking_url=sqlite_url, flowcontrol_backend=backend)
    env = SimpleNamespace(app=app, fc=FlowControl(app), backend=backend)
    name = f"q{next(_ids)}"
    backend.register(QueueConfig(name, concurrency=1, fairness=fairness))
    slot = backend.try_admit(Ticket(name, "run", HOLDER)).slot
    ids = []
    for priority, key in waiters:
        task_id = f"t{next(_ids)}"
        wait(env, name, task_id, priority=priority, key=key)
        ids.append(task_id)
    try:
        places = {t: explain(app, t)["position"] for t in ids}
        assert sorted(places.values()) == list(range(1, len(ids) + 1))
        started = []
        for _ in ids:  # each freed slot goes to the next waiter, which comes back and starts
            backend.release(slot.slot_id)
            (grant,) = backend.pending_grants(name)
            slot = backend.try_admit(Ticket(name, grant.task_id, HOLDER)).slot
            env.fc.store.delete(grant.task_id)
            started.append(grant.task_id)
        assert started == sorted(ids, key=places.__getitem__)
    finally:
        env.fc.store.close()
