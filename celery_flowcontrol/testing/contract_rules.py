"""Contract checks for serving order (priority, fifo/lifo, fairness, per-key caps), for
the three rate-limit algorithms and for restoring what an instance holds after the backend
forgot it. Collected by :mod:`.contract`."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace

from ..admission.base import (
    CONCURRENCY,
    PER_KEY,
    RATE,
    AdmissionBackend,
    Decision,
    Slot,
    sequence_floor,
)
from ..admission.release_rate import RELEASE_TAU
from ..config import QueueConfig, RateLimit
from ..errors import UnknownQueueError
from .support import FakeClock, admit, expect_admitted, expect_denied

Check = Callable[[AdmissionBackend, FakeClock], None]


def _serve_all(b: AdmissionBackend, queue: str, first_slot: str) -> list[str]:
    """Release the busy slot, confirm each grant in turn; the task ids in serving order."""
    served: list[str] = []
    slot_id = first_slot
    while True:
        b.release(slot_id)
        grants = b.pending_grants(queue)
        if not grants:
            return served
        g = grants[0]
        served.append(g.task_id)
        slot_id = expect_admitted(admit(b, queue, g.task_id)).slot.slot_id


def check_priority_order(b: AdmissionBackend, clock: FakeClock) -> None:
    """Higher priority first; equal priority in arrival order."""
    b.register(QueueConfig("q", concurrency=1))
    first = expect_admitted(admit(b, "q", "t0")).slot
    for task, prio in (("p0", 0), ("p5a", 5), ("p1", 1), ("p5b", 5), ("neg", -3)):
        expect_denied(admit(b, "q", task, priority=prio), CONCURRENCY)
    order = ["p5a", "p5b", "p1", "p0", "neg"]
    assert [w.task_id for w in b.waiters("q")] == order
    assert [w.task_id for w in b.waiters("q", limit=2)] == order[:2]
    assert _serve_all(b, "q", first.slot_id) == order


def check_lifo_order(b: AdmissionBackend, clock: FakeClock) -> None:
    """Under order="lifo" the newest waiter of equal priority goes first."""
    b.register(QueueConfig("q", concurrency=1, order="lifo"))
    first = expect_admitted(admit(b, "q", "t0")).slot
    for task, prio in (("a", 0), ("b", 0), ("hi", 1), ("c", 0)):
        admit(b, "q", task, priority=prio)
    assert _serve_all(b, "q", first.slot_id) == ["hi", "c", "b", "a"]


def check_fairness_round_robin(b: AdmissionBackend, clock: FakeClock) -> None:
    """Under fairness="key" the least recently served key goes first."""
    b.register(QueueConfig("q", concurrency=1, fairness="key"))
    first = expect_admitted(admit(b, "q", "A0", key="A")).slot
    for i in range(1, 6):
        admit(b, "q", f"A{i}", key="A")
    for i in range(3):
        admit(b, "q", f"B{i}", key="B")
    admit(b, "q", "C0", key="C")
    order = ["A1", "B0", "C0", "A2", "B1", "A3", "B2", "A4", "A5"]
    assert [w.task_id for w in b.waiters("q")] == order
    assert _serve_all(b, "q", first.slot_id) == order


def check_fairness_small_tenants(b: AdmissionBackend, clock: FakeClock) -> None:
    """One tenant's backlog can't starve others: small tenants are served in the first rounds."""
    b.register(QueueConfig("q", concurrency=2, fairness="key"))
    slots = [expect_admitted(admit(b, "q", f"big{i}", key="big")).slot for i in range(2)]
    for i in range(2, 100):
        admit(b, "q", f"big{i}", key="big")
    for tenant in ("s1", "s2"):
        for i in range(5):
            admit(b, "q", f"{tenant}-{i}", key=tenant)
    order = [w.task_id for w in b.waiters("q", limit=200)]
    small = [i for i, t in enumerate(order) if not t.startswith("big")]
    assert len(small) == 10 and max(small) < 18, order[:20]
    b.release(slots[0].slot_id)
    b.release(slots[1].slot_id)
    assert [g.task_id for g in b.pending_grants("q")] == order[:2]


def check_priority_beats_fairness(b: AdmissionBackend, clock: FakeClock) -> None:
    """Priority orders first, fairness among equal priorities."""
    b.register(QueueConfig("q", concurrency=1, fairness="key"))
    first = expect_admitted(admit(b, "q", "x", key="A")).slot
    admit(b, "q", "a-low", key="A")
    admit(b, "q", "b-low", key="B")
    admit(b, "q", "a-high", key="A", priority=2)
    assert _serve_all(b, "q", first.slot_id) == ["a-high", "b-low", "a-low"]


def check_per_key_cap(b: AdmissionBackend, clock: FakeClock) -> None:
    """per_key_concurrency caps each key; a capped key does not block other keys."""
    b.register(QueueConfig("q", concurrency=5, per_key_concurrency=2))
    a = [admit(b, "q", f"a{i}", key="a") for i in range(3)]
    assert [d.admitted for d in a] == [True, True, False]
    expect_denied(a[2], PER_KEY)
    expect_admitted(admit(b, "q", "b0", key="b"))
    s = b.stats("q")
    assert (s.in_use, s.waiting) == (3, 1)
    b.release(a[0].slot.slot_id)  # type: ignore[union-attr]
    assert [g.task_id for g in b.pending_grants("q")] == ["a2"]


def check_newcomer_after_better_waiters(b: AdmissionBackend, clock: FakeClock) -> None:
    """A freed slot is reserved for the next waiter at once, but the rate limit is taken
    when the waiter confirms; a newcomer only gets a slot nobody waits for."""
    b.register(QueueConfig("q", concurrency=1, rate_limit=RateLimit(3, 10)))
    a = expect_admitted(admit(b, "q", "a")).slot
    expect_denied(admit(b, "q", "c"), CONCURRENCY)
    expect_denied(admit(b, "q", "d"), CONCURRENCY)
    b.release(a.slot_id)
    c = expect_admitted(admit(b, "q", "c")).slot
    b.release(c.slot_id)
    expect_denied(admit(b, "q", "x", priority=5), CONCURRENCY)  # d holds the grant
    d = expect_admitted(admit(b, "q", "d")).slot
    b.release(d.slot_id)
    # The freed slot is reserved for x at once, but the rate is taken when x confirms, so a
    # grant's wake-up time can't bunch admissions past the window.
    assert [g.task_id for g in b.pending_grants("q")] == ["x"]
    r = expect_denied(admit(b, "q", "x"), RATE)
    assert [g.task_id for g in b.pending_grants("q")] == ["x"], "x keeps its grant"
    expect_denied(admit(b, "q", "vip", priority=9), RATE)
    assert b.withdraw("q", "vip")  # gives up
    clock.set(r.retry_at)
    expect_admitted(admit(b, "q", "x"))
    expect_denied(admit(b, "q", "w"), CONCURRENCY)
    b.register(QueueConfig("q", concurrency=3, rate_limit=RateLimit(3, 10)))
    assert [g.task_id for g in b.pending_grants("q")] == ["w"], "a raise grants at once"
    expect_admitted(admit(b, "q", "vip2", priority=9))
    expect_denied(admit(b, "q", "late"), CONCURRENCY)
    assert [w.task_id for w in b.waiters("q")] == ["late"]


def _burst(b: AdmissionBackend, queue: str, n: int, tag: str) -> list[Decision]:
    out = []
    for i in range(n):
        d = admit(b, queue, f"{tag}{i}")
        if d.admitted:
            b.release(d.slot.slot_id)  # type: ignore[union-attr]
        out.append(d)
    return out


def check_fixed_window(b: AdmissionBackend, clock: FakeClock) -> None:
    """fixed: `limit` per aligned window; a denial names the window's end."""
    b.register(QueueConfig("q", rate_limit="3/10s"))
    start = clock.set(1_800_000_000.0)
    res = _burst(b, "q", 4, "a")
    assert [d.admitted for d in res] == [True, True, True, False]
    assert expect_denied(res[3], RATE).retry_at == start + 10
    clock.set(start + 9.999)
    expect_denied(admit(b, "q", "b"), RATE)
    assert b.stats("q").rate_used == 3
    # The waiters give up (else the oldest, a3, would have waited a whole period at start + 10
    # and the next window would be kept for it: check_no_starvation).
    assert b.withdraw("q", "a3") and b.withdraw("q", "b")
    clock.set(start + 10)
    assert [d.admitted for d in _burst(b, "q", 4, "c")] == [True, True, True, False]
    assert b.pending_grants("q") == [], "a queue without a concurrency cap grants nothing"


def check_fixed_window_boundary(b: AdmissionBackend, clock: FakeClock) -> None:
    """fixed: an instant exactly on a window's boundary opens the new window, also where the
    period has no exact binary form (4.3 / 0.1 is 42.999... in floating point)."""
    b.register(QueueConfig("q", rate_limit={"limit": 1, "period": 0.1, "algorithm": "fixed"}))
    clock.set(4.25)
    expect_admitted(admit(b, "q", "a"))
    expect_denied(admit(b, "q", "b"), RATE)
    clock.set(4.3)
    expect_admitted(admit(b, "q", "c"))
    clock.set(1_700_000_000.3)  # a wall-clock instant on a boundary (17000000002.999998)
    expect_admitted(admit(b, "q", "d"))
    expect_denied(admit(b, "q", "e"), RATE)


def check_sliding_window(b: AdmissionBackend, clock: FakeClock) -> None:
    """sliding: never more than `limit` in any closed span of `period`."""
    b.register(QueueConfig("q", rate_limit={"limit": 3, "period": 10, "algorithm": "sliding"}))
    t0 = clock()
    for dt in (0, 4, 8):
        clock.set(t0 + dt)
        expect_admitted(admit(b, "q", f"t{dt}"))
    clock.set(t0 + 9)
    d = expect_denied(admit(b, "q", "late"), RATE)
    assert abs(d.retry_at - (t0 + 10.001)) < 1e-6, d
    clock.set(t0 + 10)
    expect_denied(admit(b, "q", "late"), RATE)
    clock.set(d.retry_at)
    expect_admitted(admit(b, "q", "late"))
    assert b.stats("q").rate_used == 3
    # Random arrivals: check every closed span of 10 s over the admission times.
    rng = random.Random(3)
    times: list[float] = []
    for i in range(300):
        clock.advance(rng.choice((0, 0.001, 0.5, 1, 2.5)))
        d2 = admit(b, "q", f"r{i}")
        if d2.admitted:
            times.append(clock())
            b.release(d2.slot.slot_id)  # type: ignore[union-attr]
        else:
            b.withdraw("q", f"r{i}")  # gives up, so newcomers are not behind waiters
    for i, start in enumerate(times):
        inside = [t for t in times[i:] if t <= start + 10]
        assert len(inside) <= 3, (start, inside)
    assert len(times) > 50


def check_gcra(b: AdmissionBackend, clock: FakeClock) -> None:
    """gcra: admissions spaced period/limit apart, `burst` at once after an idle spell."""
    b.register(QueueConfig("q", rate_limit={"limit": 10, "period": 1, "algorithm": "gcra"}))
    t0 = clock()
    expect_admitted(admit(b, "q", "a"))
    d = expect_denied(admit(b, "q", "b"), RATE)
    assert abs(d.retry_at - (t0 + 0.1)) < 1e-6, d
    clock.set(t0 + 0.1)
    expect_admitted(admit(b, "q", "b"))
    b.register(QueueConfig("g", rate_limit={"limit": 10, "period": 1, "algorithm": "gcra",
                                            "burst": 3}))
    res = _burst(b, "g", 4, "x")
    assert [r.admitted for r in res] == [True, True, True, False]
    assert abs(expect_denied(res[3], RATE).retry_at - (clock() + 0.1)) < 1e-6


def check_rate_blocks_every_priority(b: AdmissionBackend, clock: FakeClock) -> None:
    """A spent rate window denies every caller, whatever its priority or key."""
    b.register(QueueConfig("q", concurrency=10, rate_limit="1/m", fairness="key"))
    expect_admitted(admit(b, "q", "a"))
    for prio, key in ((10**6, ""), (0, "other"), (-5, "x")):
        expect_denied(admit(b, "q", f"p{prio}", priority=prio, key=key), RATE)


def check_release_rate(b: AdmissionBackend, clock: FakeClock) -> None:
    """release_rate counts the slots given back (each adds 1/TAU to a rate decaying over
    TAU seconds), not a release that frees nothing; ``None`` where a backend keeps no count."""
    b.register(QueueConfig("q", concurrency=2))
    if b.release_rate("q") is None:
        return
    assert b.release_rate("q") == 0.0, "no release yet"
    start = clock()
    slots = [expect_admitted(admit(b, "q", f"t{i}")).slot for i in range(2)]
    b.release(slots[0].slot_id)
    assert b.release(slots[0].slot_id) is False  # frees nothing: not counted
    clock.set(start + 30)
    b.release(slots[1].slot_id)
    clock.set(start + 90)
    one = 1 / RELEASE_TAU
    expected = (one * math.exp(-30 / RELEASE_TAU) + one) * math.exp(-60 / RELEASE_TAU)
    rate = b.release_rate("q")
    assert rate is not None and math.isclose(rate, expected, rel_tol=1e-9), (rate, expected)
    try:
        b.release_rate("nope")
    except UnknownQueueError as exc:
        assert exc.queue == "nope"
    else:
        raise AssertionError("an unknown queue must raise UnknownQueueError")


ORDER_CHECKS: list[Check] = [
    check_priority_order, check_lifo_order, check_fairness_round_robin,
    check_fairness_small_tenants, check_priority_beats_fairness, check_per_key_cap,
    check_newcomer_after_better_waiters,
]
RULE_CHECKS: list[Check] = [
    check_fixed_window, check_fixed_window_boundary, check_sliding_window, check_gcra,
    check_rate_blocks_every_priority, check_release_rate,
]


def _number(slot_id: str) -> int:
    return int(slot_id.rpartition(":")[2])


def check_restore_after_a_loss(b: AdmissionBackend, clock: FakeClock) -> None:
    """After the backend lost a queue, restore re-creates it and re-asserts what an instance
    holds: same ids (their release works), counted past the cap, new ids past them all."""
    config = QueueConfig("q", concurrency=2, retry=1.0)
    b.register(config)
    held = [expect_admitted(admit(b, "q", t, instance="i1", key="k")).slot for t in ("a", "b")]
    assert b.restore("i1", config, held) == [], "nothing to restore: the backend knows them"
    b.unregister("q")  # what a Redis restarted without persistence does to every queue
    clock.advance(1)
    assert b.restore("i2", config, []) == [], "another instance re-creates the queue first"
    assert b.queues() == ["q"] and b.get_config("q") == config
    c = expect_admitted(admit(b, "q", "c", instance="i2")).slot
    assert _number(c.slot_id) >= sequence_floor(clock()), "ids after a loss start past now"
    assert c.slot_id not in {s.slot_id for s in held}
    assert b.restore("i1", config, held) == [s.slot_id for s in held]
    s = b.stats("q")
    assert (s.in_use, s.capacity) == (3, 2), "running tasks count, even past the cap"
    assert {x.slot_id: x.holder for x in b.busy_slots("q")}[held[0].slot_id] == "i1"
    expect_denied(admit(b, "q", "d", instance="i2"), CONCURRENCY)
    assert b.restore("i1", config, held) == [], "once: later calls renew the lease only"
    assert b.release(held[0].slot_id) is True, "a restored slot is released by its id"
    assert b.restore("i1", config, held) == [], "a release is not undone"
    expect_denied(admit(b, "q", "d", instance="i2"), CONCURRENCY)  # 2 busy: still full
    assert b.release(c.slot_id) is True
    grant = b.pending_grants("q")
    assert [g.task_id for g in grant] == ["d"], "back under the cap: the waiter is granted"
    new = [grant[0].slot_id, expect_admitted(admit(b, "q", "d", instance="i2")).slot.slot_id]
    assert min(_number(n) for n in new) > max(_number(x.slot_id) for x in [*held, c])
    assert b.release(held[1].slot_id) is True
    assert b.stats("q").in_use == 1


def check_restore_skips_what_it_must(b: AdmissionBackend, clock: FakeClock) -> None:
    """Restore leaves out slots past their max_hold, ids busy for another task, tasks that
    hold a slot, other queues' slots; the sequence still moves past every id passed; a
    lapsed instance restores again."""
    config = QueueConfig("q", concurrency=5, max_hold=600)
    b.register(config)
    busy = expect_admitted(admit(b, "q", "x", instance="i2")).slot
    now = clock()

    def mine(n: int, task: str, expires_at: float = now + 100, queue: str = "q") -> Slot:
        return Slot(f"q:{n}", queue, "i1", task, "", "", now - 1, expires_at)
    slots = [mine(50, "late", expires_at=now), replace(busy, task_id="other"),
             mine(51, "x"), mine(52, "o", queue="r"), mine(7, "ok")]
    assert b.restore("i1", config, slots) == ["q:7"]
    ok = {x.slot_id: x for x in b.busy_slots("q")}["q:7"]
    assert (ok.task_id, ok.holder, ok.acquired_at, ok.expires_at) == ("ok", "i1", now - 1, now + 100)
    assert _number(expect_admitted(admit(b, "q", "y", instance="i2")).slot.slot_id) == 52
    assert b.restore("i1", config, slots) == []
    clock.advance(b.instance_ttl + 1)  # i1 stops heartbeating: its slots are reclaimed
    b.heartbeat("i2")
    assert b.reclaim().instances == 1
    assert b.restore("i1", config, slots) == ["q:7"], "a lapsed instance is forgotten"
    clock.set(now + 100)
    b.heartbeat("i1")
    b.heartbeat("i2")
    assert b.reclaim().max_hold == 1, "a restored slot keeps its max_hold expiry"


def check_restore_keeps_a_live_config(b: AdmissionBackend, clock: FakeClock) -> None:
    """Restore into a queue that exists keeps its config and its slot sequence."""
    b.register(QueueConfig("q", concurrency=3))
    first = expect_admitted(admit(b, "q", "a")).slot
    assert b.restore("i9", QueueConfig("q", concurrency=1), []) == []
    assert b.get_config("q").concurrency == 3
    assert _number(expect_admitted(admit(b, "q", "b")).slot.slot_id) == _number(first.slot_id) + 1


def check_sweeps_by_queue(b: AdmissionBackend, clock: FakeClock) -> None:
    """A heartbeat, a reclaim pass and the pending grants named by queues touch those queues:
    a lease renewed in some queues lapses in the others; ``reclaim(queues)`` frees what lapsed
    there and ``reclaim()`` what lapsed anywhere; unknown names are skipped."""
    for name in ("a", "b", "c"):
        b.register(QueueConfig(name, concurrency=1))
    held = {n: expect_admitted(admit(b, n, f"t{n}", instance="w")).slot for n in ("a", "b", "c")}
    for n in ("a", "b", "c"):
        expect_denied(admit(b, n, f"u{n}", instance="x"), CONCURRENCY)
    clock.advance(b.instance_ttl * 0.6)
    b.heartbeat("w", queues=["a", "nope"])  # w holds on in "a" only
    b.heartbeat("x")
    clock.advance(b.instance_ttl * 0.6)
    b.heartbeat("x")
    assert b.reclaim(queues=["b", "nope"]).instances == 1, "w's lease lapsed in b"
    assert [g.task_id for g in b.pending_grants(queues=["b", "c", "nope"])] == ["ub"]
    assert [s.slot_id for s in b.busy_slots("a")] == [held["a"].slot_id], "renewed in a"
    assert b.reclaim().instances == 1, "and in c, found by the pass over every queue"
    assert [g.task_id for g in b.pending_grants()] == ["ub", "uc"]
    assert b.pending_grants(queues=[]) == [] and b.reclaim(queues=[]).instances == 0


RESTORE_CHECKS: list[Check] = [
    check_restore_after_a_loss, check_restore_skips_what_it_must,
    check_restore_keeps_a_live_config, check_sweeps_by_queue,
]
