"""RedisBackend makes the same decisions as the in-process reference, step for step.

A hypothesis state machine drives both backends with the same random operations (queues with
several rate limits at once, per call and per cost, adaptive ones, per-key windows; unequal
tenants: weights, per-key overrides from keys= and set_key/reset_key, reserves, waiting
bounds, pauses of queues and keys; tickets with costs; settles; backoffs of queues and keys)
and the same fake clock (whole
milliseconds, returned as ``ms / 1000`` so both sides see the same float), and after every
step compares everything an operator or a worker can see: decisions (slot ids, retry_at to
the last bit, reasons), stats, waiter order, busy slots, pending grants, reclaim reports,
restores, settles, backoffs, refusals, the keys' stats and would-be refusals, errors, and at
the end the grants announced on each side.

The TTLs and periods are deliberately inexact binary fractions (0.7 s, 1.3 s...): the Lua
scripts repeat the reference's float operations, so even those agree exactly.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.admission.base import Admitted, Grant, Slot
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig, RateLimit

QUEUES = ("a", "b")
TASKS = tuple(f"t{i}" for i in range(8))
INSTANCES = ("i0", "i1", "i2")
KEYS = ("", "k1", "k2", "k3")
TTLS = {"instance_ttl": 2.3, "grant_ttl": 0.7, "waiter_ttl": 3.1}
#: Ticket costs: the default most often, fractions, ones past small per-cost limits (refused).
COSTS = st.sampled_from([1, 1, 1, 2, 0.5, 3, 5, 7])


class MsClock:
    """A clock in whole milliseconds; ``ms / 1000`` is the one float both backends see."""

    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> float:
        return self.ms / 1000


@st.composite
def rate_limits(draw: st.DrawFn, keyed: bool = False) -> RateLimit:
    algorithm = draw(st.sampled_from(["fixed", "sliding", "gcra"]))
    per = draw(st.sampled_from(["call", "call", "cost"]))
    burst = draw(st.integers(1, 3 if per == "call" else 6)) if algorithm == "gcra" else 1
    limit = draw(st.integers(1, 3) if per == "call" else st.integers(2, 6))
    adaptive = not keyed and draw(st.sampled_from([False, False, True]))
    return RateLimit(limit, draw(st.sampled_from([0.3, 1.0, 1.3, 2.0])), algorithm, burst,
                     per=per, adaptive=adaptive)


def rate_limit_sets(keyed: bool = False) -> st.SearchStrategy[Any]:
    """None, one limit, or a list of distinct ones (costs, adaptive, several windows)."""
    one = rate_limits(keyed)
    return (st.none() | one
            | st.lists(one, min_size=1, max_size=3, unique=True).map(tuple))


@st.composite
def configs(draw: st.DrawFn, name: str) -> QueueConfig:
    concurrency = draw(st.sampled_from([None, 1, 1, 2, 2, 3, 4]))
    per_key = draw(st.none() | st.integers(1, concurrency or 3))
    max_hold = draw(st.none() | st.sampled_from([0.9, 2.5]))
    manual = max_hold is not None and draw(st.booleans())
    cap = per_key or concurrency
    tenants = draw(st.booleans())
    return QueueConfig(
        name, concurrency=concurrency,
        rate_limit=draw(st.sampled_from([None, None]) | rate_limit_sets()),
        per_key_rate_limit=draw(st.sampled_from([None, None, None]) | rate_limit_sets(True)),
        retry=draw(st.sampled_from([0.25, 0.7, 1.0])),
        fairness=draw(st.sampled_from(["fifo", "key"])),
        order=draw(st.sampled_from(["fifo", "lifo"])),
        per_key_concurrency=per_key, release="manual" if manual else "on_result",
        max_hold=max_hold,
        per_key_reserve=draw(st.none() | st.integers(0, cap or 2)) if tenants else None,
        per_key_max_waiting=draw(st.none() | st.integers(1, 3)) if tenants else None,
        max_waiting=draw(st.none() | st.integers(2, 6)) if tenants else None,
        keys=draw(st.dictionaries(st.sampled_from(KEYS), key_fields(concurrency, per_key),
                                  max_size=3)) if tenants else None)


#: Weights, some of them inexact binary fractions (their steps cost / weight too).
WEIGHTS = st.sampled_from([1, 2, 3, 0.5, 0.3, 1.7])


@st.composite
def key_fields(draw: st.DrawFn, concurrency: int | None, per_key: int | None,
               partial: bool = False) -> dict[str, Any]:
    """A keys= entry (or set_key's fields: some given as None, which drops them)."""
    own = draw(st.none() | st.integers(1, concurrency or 3))
    cap = own or per_key or concurrency
    fields = {"weight": draw(st.none() | WEIGHTS), "concurrency": own,
              "rate_limit": draw(st.sampled_from([None, None]) | rate_limit_sets(True)),
              "reserve": draw(st.none() | st.integers(0, cap or 2)),
              "max_waiting": draw(st.none() | st.integers(1, 3))}
    if partial:
        return {f: v for f, v in fields.items() if draw(st.booleans())}
    return {f: v for f, v in fields.items() if v is not None}


def _both(ref: Any, red: Any, call: str, *args: Any, **kwargs: Any) -> Any:
    """Call *call* on both; they must agree on the result or on the error class."""
    outcomes = []
    for backend in (ref, red):
        try:
            outcomes.append(("ok", getattr(backend, call)(*args, **kwargs)))
        except Exception as exc:  # compared by class below
            outcomes.append(("error", type(exc).__name__))
    assert outcomes[0] == outcomes[1], (call, args, kwargs, outcomes)
    return outcomes[0][1]


class RedisMatchesReference(RuleBasedStateMachine):
    client: redis.Redis

    def __init__(self) -> None:
        super().__init__()
        self.clock = MsClock()
        self.prefix = f"fct-sm-{uuid.uuid4().hex[:8]}"
        self.ref = MemoryBackend(clock=self.clock, **TTLS)
        self.red = RedisBackend(self.client, key_prefix=self.prefix, clock=self.clock, **TTLS)
        self.ref_heard: list[Grant] = []
        self.red_heard: list[Grant] = []
        self.ref.subscribe_grants(self.ref_heard.append)
        self.red.subscribe_grants(self.red_heard.append)
        self.slot_ids: list[str] = ["a:999", "b:1", "zz:1"]
        self.slots_seen: list[Slot] = []

    def teardown(self) -> None:
        try:
            deadline = time.monotonic() + 3
            while len(self.red_heard) < len(self.ref_heard) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert self.red_heard == self.ref_heard, "the same grants were announced"
        finally:
            self.red.close()
            keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=1000))
            if keys:
                self.client.delete(*keys)

    # -- operations -----------------------------------------------------------------------
    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        for name in QUEUES:
            _both(self.ref, self.red, "register", data.draw(configs(name)))

    @rule(data=st.data(), name=st.sampled_from(QUEUES),
          action=st.sampled_from(["register", "unregister", "set_capacity", "set_max_hold",
                                  "set_rate_limit"]))
    def operator(self, data: st.DataObject, name: str, action: str) -> None:
        # One rule for the rarer operator actions, so admissions dominate the runs.
        if action == "register":
            _both(self.ref, self.red, "register", data.draw(configs(name)))
        elif action == "unregister":
            _both(self.ref, self.red, "unregister", name, data.draw(st.booleans()))
        elif action == "set_rate_limit":
            _both(self.ref, self.red, "set_rate_limit", name, data.draw(rate_limit_sets()))
        elif action == "set_capacity":
            _both(self.ref, self.red, "set_capacity", name,
                  data.draw(st.none() | st.integers(0, 4)))
        else:
            _both(self.ref, self.red, "set_max_hold", name,
                  data.draw(st.sampled_from([None, 0.4, 1.5])))

    @rule(data=st.data(), name=st.sampled_from(QUEUES), key=st.sampled_from(KEYS),
          action=st.sampled_from(["set_key", "set_key", "reset_key", "pause", "pause_key",
                                  "resume", "resume_key"]))
    def tenant(self, data: st.DataObject, name: str, key: str, action: str) -> None:
        # Run-time settings of a key (checked as config is: a bad one fails alike), pauses
        # with and without an end, resumes.
        if action == "set_key":
            config = self.ref.get_config(name) if name in self.ref.queues() else None
            fields = data.draw(key_fields(config.concurrency if config else None,
                                          config.per_key_concurrency if config else None, True))
            _both(self.ref, self.red, "set_key", name, key, **fields)
        elif action == "reset_key":
            _both(self.ref, self.red, "reset_key", name, key)
        elif action.startswith("pause"):
            until = data.draw(st.sampled_from([None, 0.5, 2.0]))
            _both(self.ref, self.red, "pause", name, key if action == "pause_key" else None,
                  None if until is None else self.clock() + until)
        else:
            _both(self.ref, self.red, "resume", name, key if action == "resume_key" else None)

    @rule(name=st.sampled_from(QUEUES), key=st.sampled_from(KEYS))
    def read_keys(self, name: str, key: str) -> None:
        # What an operator and a producer read of the keys (a rule, not an invariant: each
        # read is a script call, and the decisions compared at every step show the rest).
        _both(self.ref, self.red, "key_stats", name, 10)
        sides = []
        for backend in (self.ref, self.red):
            try:
                err = backend.would_refuse(name, key)
                sides.append(None if err is None else err.args)  # FlowQueueFull by its fields
            except Exception as exc:
                sides.append(type(exc).__name__)
        assert sides[0] == sides[1], ("would_refuse", name, key, sides)

    @rule(queue=st.sampled_from(QUEUES + ("a",)), task=st.sampled_from(TASKS),
          instance=st.sampled_from(INSTANCES), priority=st.sampled_from([0, 0, 0, 1, -1]),
          key=st.sampled_from(KEYS), label=st.sampled_from(["", "x"]), cost=COSTS)
    def admit(self, queue: str, task: str, instance: str, priority: int, key: str,
              label: str, cost: float) -> None:
        decision = _both(self.ref, self.red, "try_admit",
                         Ticket(queue, task, instance, priority, key, label, cost))
        if isinstance(decision, Admitted):
            self.slot_ids.append(decision.slot.slot_id)
            self.slots_seen.append(decision.slot)

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        _both(self.ref, self.red, "release", data.draw(st.sampled_from(self.slot_ids)))

    @rule(data=st.data())
    @precondition(lambda self: any(self.ref.busy_slots(q) for q in self.ref.queues()))
    def release_busy(self, data: st.DataObject) -> None:
        busy = [s.slot_id for q in self.ref.queues() for s in self.ref.busy_slots(q)]
        _both(self.ref, self.red, "release", data.draw(st.sampled_from(busy)))

    @rule(data=st.data(), instance=st.sampled_from(INSTANCES), label=st.sampled_from(["", "y"]),
          cost=COSTS)
    @precondition(lambda self: any(self.ref.waiters(q) for q in self.ref.queues()))
    def recheck(self, data: st.DataObject, instance: str, label: str, cost: float) -> None:
        w = data.draw(st.sampled_from([w for q in self.ref.queues() for w in self.ref.waiters(q)]))
        # A waiter comes back (its priority and key as first asked; the backend keeps those).
        decision = _both(self.ref, self.red, "try_admit",
                         Ticket(w.queue, w.task_id, instance, w.priority, w.fairness_key, label,
                                cost))
        if isinstance(decision, Admitted):
            self.slot_ids.append(decision.slot.slot_id)
            self.slots_seen.append(decision.slot)

    @rule(data=st.data(), cost=COSTS)
    @precondition(lambda self: bool(self.ref.pending_grants()))
    def confirm_grant(self, data: st.DataObject, cost: float) -> None:
        g = data.draw(st.sampled_from(self.ref.pending_grants()))
        decision = _both(self.ref, self.red, "try_admit",
                         Ticket(g.queue, g.task_id, data.draw(st.sampled_from(INSTANCES)),
                                cost=cost))
        if isinstance(decision, Admitted):
            self.slot_ids.append(decision.slot.slot_id)
            self.slots_seen.append(decision.slot)

    @rule(data=st.data(), name=st.sampled_from(QUEUES), instance=st.sampled_from(INSTANCES))
    def restore(self, data: st.DataObject, name: str, instance: str) -> None:
        # An instance re-asserts slots it was admitted with (busy, released or reclaimed
        # since), maybe after the queue was lost; the config only counts for a missing queue.
        seen = [s for s in self.slots_seen if s.queue == name]
        picked = data.draw(st.lists(st.sampled_from(seen), max_size=3, unique=True)) if seen \
            else []
        _both(self.ref, self.red, "restore", instance, data.draw(configs(name)), picked)

    @rule(data=st.data(), actual=st.sampled_from([0, 0.5, 1, 2, 3, 7, -1]))
    def settle(self, data: st.DataObject, actual: float) -> None:
        # Busy, released or never-seen slots; refunds, overdrafts, a refused value.
        _both(self.ref, self.red, "settle", data.draw(st.sampled_from(self.slot_ids)), actual)

    @rule(data=st.data(), actual=st.sampled_from([0, 0.5, 1, 2, 4]))
    @precondition(lambda self: any(self.ref.busy_slots(q) for q in self.ref.queues()))
    def settle_busy(self, data: st.DataObject, actual: float) -> None:
        busy = [s.slot_id for q in self.ref.queues() for s in self.ref.busy_slots(q)]
        _both(self.ref, self.red, "settle", data.draw(st.sampled_from(busy)), actual)

    @rule(queue=st.sampled_from(QUEUES), seconds=st.sampled_from([0.3, 1.0, 2.3, 0]),
          key=st.sampled_from((None, None) + KEYS))
    def backoff(self, queue: str, seconds: float, key: str | None) -> None:
        _both(self.ref, self.red, "backoff", queue, seconds, key)

    @rule(queue=st.sampled_from(QUEUES), task=st.sampled_from(TASKS))
    def withdraw(self, queue: str, task: str) -> None:
        _both(self.ref, self.red, "withdraw", queue, task)

    @rule(instance=st.sampled_from(INSTANCES))
    def heartbeat(self, instance: str) -> None:
        _both(self.ref, self.red, "heartbeat", instance)

    @rule()
    def reclaim(self) -> None:
        _both(self.ref, self.red, "reclaim")

    @rule(ms=st.sampled_from([1, 7, 100, 299, 300, 700, 1000, 1300, 2300, 3100]))
    def advance(self, ms: int) -> None:
        self.clock.ms += ms

    # -- what both must show alike ----------------------------------------------------------
    @invariant()
    def same_view(self) -> None:
        _both(self.ref, self.red, "queues")
        _both(self.ref, self.red, "pending_grants")
        for name in QUEUES:
            _both(self.ref, self.red, "stats", name)
            _both(self.ref, self.red, "waiters", name, 50)
            _both(self.ref, self.red, "busy_slots", name)



# 80 runs of up to 50 steps, each step compared on both sides through some ten Redis round
# trips: on a loaded machine that outlasts the suite's default bound, and a timeout raised
# inside Hypothesis is taken for a failure and shrunk. The bound here is for a hang only.
@pytest.mark.timeout(600)
def test_redis_backend_matches_the_reference(redis_client: redis.Redis) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    class Machine(RedisMatchesReference):
        client = redis_client

    run_state_machine_as_test(Machine, settings=settings(
        max_examples=80, stateful_step_count=50, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


@pytest.mark.parametrize("fairness", ["fifo", "key"])
def test_a_recheck_keeps_the_waiters_place(redis_client: redis.Redis, key_prefix: str,
                                           fairness: str) -> None:
    """A waiter alone in its key's line that re-checks keeps its turn among the keys.

    a1 waits from virtual time 1; b1's key line starts later (2). When a1 re-checks after
    another key was served (virtual clock 3), it must still go before b1.
    """
    clock = MsClock()
    ref = MemoryBackend(clock=clock, **TTLS)
    red = RedisBackend(redis_client, key_prefix=key_prefix, clock=clock, **TTLS)
    try:
        for b in (ref, red):
            b.register(QueueConfig("q", concurrency=1, fairness=fairness))

        def admit(task: str, key: str, priority: int = 0) -> Any:
            return _both(ref, red, "try_admit", Ticket("q", task, "i0", priority, key))

        x = admit("x", "z")
        admit("a1", "a")
        admit("c1", "c", 1)
        _both(ref, red, "release", x.slot.slot_id)      # granted to c1: c is served
        admit("b1", "b")
        admit("d1", "d", 2)
        c1 = admit("c1", "c")                             # confirms its grant
        _both(ref, red, "release", c1.slot.slot_id)     # granted to d1: d is served
        assert not admit("a1", "a").admitted              # a1 re-checks
        order = _both(ref, red, "waiters", "q", 10)
        assert [w.task_id for w in order] == ["a1", "b1"]
    finally:
        red.close()


def _pair(redis_client: redis.Redis, key_prefix: str) -> tuple[MsClock, MemoryBackend, RedisBackend]:
    clock = MsClock()
    return (clock, MemoryBackend(clock=clock, **TTLS),
            RedisBackend(redis_client, key_prefix=key_prefix, clock=clock, **TTLS))


def test_grant_scan_stops_after_key_scan_lines(redis_client: redis.Redis, key_prefix: str) -> None:
    """A grant looks at the first KEY_SCAN lines only (a bound on one decision's cost)."""
    _, ref, red = _pair(redis_client, key_prefix)
    try:
        for b in (ref, red):
            b.register(QueueConfig("q", concurrency=200, per_key_concurrency=1, fairness="key"))
        held = [_both(ref, red, "try_admit", Ticket("q", f"h{i}", "i0", 0, f"k{i:02}")).slot
                for i in range(70)]
        for i in range(70):
            _both(ref, red, "try_admit", Ticket("q", f"w{i}", "i0", 0, f"k{i:02}"))
        _both(ref, red, "release", held[2].slot_id)     # w2's line is the third: granted
        assert [g.task_id for g in _both(ref, red, "pending_grants", "q")] == ["w2"]
        _both(ref, red, "release", held[69].slot_id)    # w69's line is past the scan
        assert [g.task_id for g in _both(ref, red, "pending_grants", "q")] == ["w2"]
    finally:
        red.close()


def test_a_capped_newcomer_still_serves_the_waiters_ahead(redis_client: redis.Redis,
                                                          key_prefix: str) -> None:
    """A newcomer over its key's cap is denied, but first the free slots go to waiters."""
    clock, ref, red = _pair(redis_client, key_prefix)
    try:
        for b in (ref, red):
            b.register(QueueConfig("q", concurrency=5, per_key_concurrency=1,
                                   rate_limit=RateLimit(1, 1.0)))
        _both(ref, red, "try_admit", Ticket("q", "a0", "i0", 0, "a"))
        clock.ms += 500  # d1 comes mid-window: it won't have waited a period (no guard)
        _both(ref, red, "try_admit", Ticket("q", "d1", "i0", 0, "d"))   # rate: waits
        clock.ms += 500
        d = _both(ref, red, "try_admit", Ticket("q", "a1", "i0", 5, "a"))
        assert not d.admitted and d.reason == "per_key"
        assert [g.task_id for g in _both(ref, red, "pending_grants", "q")] == ["d1"]
    finally:
        red.close()


def test_a_grant_confirmed_in_a_spent_window_waits_and_is_kept(redis_client: redis.Redis,
                                                               key_prefix: str) -> None:
    """The rate is taken at confirmation: a grantee that comes back while the window is spent
    is denied for the rate, and its grant is kept until the window's end plus grant_ttl."""
    clock, ref, red = _pair(redis_client, key_prefix)
    try:
        for b in (ref, red):
            b.register(QueueConfig("q", concurrency=1, rate_limit=RateLimit(1, 10.0)))
        first = _both(ref, red, "try_admit", Ticket("q", "t1", "i0"))
        _both(ref, red, "try_admit", Ticket("q", "t2", "i0"))
        _both(ref, red, "release", first.slot.slot_id)          # granted to t2, no rate taken
        d = _both(ref, red, "try_admit", Ticket("q", "t2", "i1"))
        assert not d.admitted and d.reason == "rate"
        [g] = _both(ref, red, "pending_grants", "q")
        assert g.task_id == "t2" and g.expires_at == d.retry_at + TTLS["grant_ttl"]
        clock.ms = round(d.retry_at * 1000)
        assert _both(ref, red, "try_admit", Ticket("q", "t2", "i1")).admitted
    finally:
        red.close()
