"""The conformance kit's quota rules: several limits, costs, per-key windows, no starvation,
settled costs, backoffs and adaptive limits (rules 11 to 14 of :mod:`..admission.base`).

Each check gets a fresh backend and a :class:`.support.FakeClock` on a whole second (so whole
10-second windows start on it), as in :mod:`.contract`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from ..admission.base import BACKOFF, KEY_RATE, RATE, AdmissionBackend, Grant, Ticket
from ..config import QueueConfig, RateLimit
from ..errors import CostRefusedError, FlowControlConfigError, SettleError, UnknownQueueError
from .support import FakeClock, admit, expect_admitted, expect_denied

Check = Callable[[AdmissionBackend, FakeClock], None]


def _raises(error: type[Exception], call: Callable[[], object]) -> Exception:
    try:
        call()
    except error as exc:
        return exc
    raise AssertionError(f"expected {error.__name__}")


def check_several_limits_at_once(b: AdmissionBackend, clock: FakeClock) -> None:
    """Every limit of the list holds; a denial names the one instant all of them admit."""
    b.register(QueueConfig("q", rate_limit=["2/s", "3/10s"]))
    start = clock()
    expect_admitted(admit(b, "q", "a0"))
    expect_admitted(admit(b, "q", "a1"))
    assert expect_denied(admit(b, "q", "a2"), RATE).retry_at == start + 1, "2/s is spent"
    assert b.withdraw("q", "a2")
    clock.set(start + 1)
    expect_admitted(admit(b, "q", "b0"))
    d = expect_denied(admit(b, "q", "b1"), RATE)
    assert d.retry_at == start + 10, "2/s admits now, 3/10s only at start + 10"
    used = [u.used for u in b.stats("q").rates]
    assert used == [1, 3], used
    clock.set(d.retry_at)
    expect_admitted(admit(b, "q", "b1"))
    b.register(QueueConfig("s", rate_limit=[{"limit": 1, "period": 2, "algorithm": "sliding"},
                                            {"limit": 4, "period": 1, "algorithm": "gcra",
                                             "burst": 1}]))
    t0 = clock()
    expect_admitted(admit(b, "s", "c0"))
    assert expect_denied(admit(b, "s", "c1"), RATE).retry_at == t0 + 2.001


def check_costs_count_in_cost_windows(b: AdmissionBackend, clock: FakeClock) -> None:
    """per="cost" counts the ticket's cost, per="call" counts 1; a cost no limit can ever
    admit is refused with CostRefusedError and changes nothing."""
    b.register(QueueConfig("q", rate_limit=["5/s", {"limit": 100, "period": 10, "per": "cost"}]))
    start = clock()
    expect_admitted(admit(b, "q", "t0", cost=60))
    expect_admitted(admit(b, "q", "t1", cost=30))
    assert expect_denied(admit(b, "q", "t2", cost=20), RATE).retry_at == start + 10
    expect_admitted(admit(b, "q", "t3", cost=10))
    assert [u.used for u in b.stats("q").rates] == [3, 100]
    before = b.stats("q")
    err = _raises(CostRefusedError, lambda: admit(b, "q", "huge", cost=101))
    assert (err.queue, err.field) == ("q", "flow_cost") and "100 per 10 s" in str(err)  # type: ignore[attr-defined]
    assert b.stats("q") == before and "huge" not in [w.task_id for w in b.waiters("q")]
    b.register(QueueConfig("g", rate_limit={"limit": 10, "period": 1, "algorithm": "gcra",
                                            "burst": 5, "per": "cost"}))
    _raises(CostRefusedError, lambda: admit(b, "g", "g0", cost=6))
    expect_admitted(admit(b, "g", "g1", cost=5))
    assert expect_denied(admit(b, "g", "g2", cost=1), RATE).retry_at == clock() + 0.1
    for bad in (0, -1, math.nan, math.inf, "3", True):
        _raises(CostRefusedError, lambda bad=bad: Ticket("q", "t", "i", cost=bad))  # type: ignore[misc]


def check_per_key_windows(b: AdmissionBackend, clock: FakeClock) -> None:
    """Each fairness key has its own windows, beside the queue's."""
    b.register(QueueConfig("q", rate_limit="4/10s", per_key_rate_limit=["2/10s"]))
    start = clock()
    expect_admitted(admit(b, "q", "a0", key="a"))
    expect_admitted(admit(b, "q", "a1", key="a"))
    assert expect_denied(admit(b, "q", "a2", key="a"), KEY_RATE).retry_at == start + 10
    expect_admitted(admit(b, "q", "b0", key="b"))
    expect_admitted(admit(b, "q", "c0", key="c"))
    d0 = expect_denied(admit(b, "q", "d0", key="d"), RATE)  # the queue's window
    assert d0.retry_at == start + 10 + 0.9 * 2.5, "queue-wide, a turn (10 s / 4) behind a2"
    assert b.stats("q").rates[0].used == 4
    for task in ("a2", "d0"):
        b.withdraw("q", task)
    clock.set(start + 10)
    expect_admitted(admit(b, "q", "a2", key="a"))
    b.register(QueueConfig("k", per_key_rate_limit={"limit": 3, "period": 5, "per": "cost"}))
    expect_admitted(admit(b, "k", "x0", key="x", cost=3))
    expect_denied(admit(b, "k", "x1", key="x", cost=1), KEY_RATE)
    expect_admitted(admit(b, "k", "y0", key="y", cost=2))
    _raises(CostRefusedError, lambda: admit(b, "k", "y1", key="y", cost=4))


def check_a_key_its_windows_hold_takes_no_slot(b: AdmissionBackend, clock: FakeClock) -> None:
    """A grant reserves a slot, so it goes only to a waiter its key's own windows (and
    backoff) let in now: a tenant held by its per-key limit does not keep the queue's
    concurrency from another tenant whose windows are open."""
    b.register(QueueConfig("q", concurrency=2, fairness="key", per_key_rate_limit=[
        "2/10s", {"limit": 10, "period": 10, "per": "cost"}]))
    start = clock()
    slots = [expect_admitted(admit(b, "q", f"h{i}", key="heavy")).slot for i in range(2)]
    for i in range(2, 6):
        expect_denied(admit(b, "q", f"h{i}", key="heavy"), KEY_RATE)
    for slot in slots:
        b.release(slot.slot_id)
    assert b.pending_grants("q") == [], "heavy's waiters can't use a slot before start + 10"
    light = expect_admitted(admit(b, "q", "l0", key="light")).slot
    expect_admitted(admit(b, "q", "l1", key="light", cost=4))
    assert expect_denied(admit(b, "q", "l2", key="light", cost=5), KEY_RATE).retry_at == start + 10
    assert b.withdraw("q", "l2")
    clock.set(start + 10)
    b.release(light.slot_id)
    assert [g.task_id for g in b.pending_grants("q")] == ["h2"], "its window opened: granted"
    expect_admitted(admit(b, "q", "h2", key="heavy"))


def check_a_waiter_no_window_admits_now_takes_no_grant(b: AdmissionBackend,
                                                       clock: FakeClock) -> None:
    """A config that lowers a per-cost limit below a waiter's cost leaves a waiter that can
    never pass: it is given no slot (it is refused when it comes back), the next one is."""
    b.register(QueueConfig("q", rate_limit="1/10s"))
    expect_admitted(admit(b, "q", "t0"))
    expect_denied(admit(b, "q", "big", cost=3), RATE)
    expect_denied(admit(b, "q", "small", key="k", cost=1), RATE)
    b.register(QueueConfig("q", concurrency=4, fairness="key", per_key_rate_limit=[
        {"limit": 2, "period": 1, "algorithm": "sliding", "per": "cost"}]))
    assert [g.task_id for g in b.pending_grants("q")] == ["small"]
    _raises(CostRefusedError, lambda: admit(b, "q", "big", cost=3))


def check_a_rate_line_comes_back_turn_by_turn(b: AdmissionBackend, clock: FakeClock) -> None:
    """A waiter denied by a rate limit learns when its turn comes, counting the waiters ahead
    of it in its line, so a backlog is woken at the pace the window admits it, not all at
    once each time room for one appears. A sliding per-call log frees room exactly where its
    entries leave the span: with k waiters ahead, the turn is when the log has room for the
    (k+1)-th (the entry k places past the first that must leave, + period + 1 ms); a limit
    or more back, one period (+ 1 ms) after the turn of the waiter a limit ahead. Other
    windows: the instant the limits let it in, plus one pace of the window (period x charge /
    limit) for each waiter ahead, times 0.9 (a turn errs early). A key's window counts only
    the key's own line (fairness="key"); a shared line gives no turns for a key's window."""
    b.register(QueueConfig("q", rate_limit={"limit": 4, "period": 10, "algorithm": "sliding"}))
    start = clock()
    for i in range(4):
        clock.set(start + i)
        expect_admitted(admit(b, "q", f"a{i}"))
    turns = [expect_denied(admit(b, "q", f"w{i}"), RATE).retry_at for i in range(6)]
    first = turns[0]
    assert [round(t - start, 6) for t in turns] == [
        10.001, 11.001, 12.001, 13.001, 20.002, 21.002], "where the log frees room"
    assert expect_denied(admit(b, "q", "w1"), RATE).retry_at == turns[1], "a re-check keeps it"
    b.withdraw("q", "w0")
    assert expect_denied(admit(b, "q", "w1"), RATE).retry_at == first, "now first in line"
    assert expect_denied(admit(b, "q", "w4"), RATE).retry_at == turns[3], "one ahead less"
    b.register(QueueConfig("g", rate_limit={"limit": 4, "period": 10, "algorithm": "gcra",
                                            "burst": 1}))
    expect_admitted(admit(b, "g", "g0"))
    paced = [expect_denied(admit(b, "g", f"g{i}"), RATE).retry_at for i in range(1, 4)]
    assert [round(t - paced[0], 6) for t in paced] == [0, 0.9 * 2.5, 0.9 * 5.0], "a tenth early"
    b.register(QueueConfig("k", fairness="key", per_key_rate_limit={
        "limit": 10, "period": 10, "per": "cost", "algorithm": "gcra", "burst": 10}))
    expect_admitted(admit(b, "k", "h0", key="heavy", cost=10))
    heavy = [expect_denied(admit(b, "k", f"h{i}", key="heavy", cost=5), KEY_RATE).retry_at
             for i in range(1, 4)]
    assert [round(t - heavy[0], 6) for t in heavy] == [0, 4.5, 9.0], "cost 5 of 10 per 10 s"
    expect_admitted(admit(b, "k", "l0", key="light", cost=5))
    b.register(QueueConfig("s", per_key_rate_limit="1/10s"))
    expect_admitted(admit(b, "s", "x0", key="x"))
    expect_admitted(admit(b, "s", "y0", key="y"))
    shared = [expect_denied(admit(b, "s", f"{k}1", key=k), KEY_RATE).retry_at for k in "xy"]
    assert shared[0] == shared[1], "a shared line: the key's window gives no turns"


def check_no_starvation_of_a_large_cost(b: AdmissionBackend, clock: FakeClock) -> None:
    """Once the oldest rate-blocked waiter has waited one period, later callers queue behind
    it; unless it did not come back within grant_ttl of its turn."""
    b.register(QueueConfig("q", retry=1.0,
                           rate_limit={"limit": 10, "period": 10, "per": "cost"}))
    start = clock()
    expect_admitted(admit(b, "q", "s0", cost=6))
    big = expect_denied(admit(b, "q", "big", cost=10), RATE)
    assert big.retry_at == start + 10
    clock.set(start + 5)
    expect_admitted(admit(b, "q", "s1", cost=4)), "big has not waited a period yet"
    clock.set(start + 10)
    kept = expect_denied(admit(b, "q", "s2", cost=1), RATE)
    assert kept.retry_at == start + 11, "the window is kept for big, which fits now"
    expect_admitted(admit(b, "q", "big", cost=10))
    assert expect_denied(admit(b, "q", "s2", cost=1), RATE).retry_at == start + 20
    # A head that does not come back within grant_ttl of its turn keeps nobody waiting.
    assert b.withdraw("q", "s2")
    clock.set(start + 20)
    expect_admitted(admit(b, "q", "s3", cost=9))
    late = expect_denied(admit(b, "q", "big2", cost=10), RATE)
    clock.set(late.retry_at + 10)
    expect_denied(admit(b, "q", "s4", cost=1), RATE)
    clock.set(late.retry_at + b.grant_ttl)
    expect_admitted(admit(b, "q", "s4", cost=1))


def check_the_line_keeps_no_room_for_a_head_its_key_holds(b: AdmissionBackend,
                                                           clock: FakeClock) -> None:
    """The rate line keeps the queue's windows only for a head that could use them: one its
    own key's limits hold back longer keeps nobody else out."""
    b.register(QueueConfig("q", retry=1.0, rate_limit={"limit": 10, "period": 10, "per": "cost"},
                           per_key_rate_limit={"limit": 10, "period": 20, "per": "cost"}))
    start = clock()
    expect_admitted(admit(b, "q", "a0", key="a", cost=6))
    big = expect_denied(admit(b, "q", "big", key="a", cost=10), KEY_RATE)
    assert big.retry_at == start + 20, "its key's window holds it longest"
    clock.set(start + 11)  # big has waited a period of the queue's window, which is open
    expect_admitted(admit(b, "q", "b0", key="b", cost=1))


def check_a_caller_of_the_heads_cost_may_take_the_window(b: AdmissionBackend,
                                                         clock: FakeClock) -> None:
    """The rate line keeps the window only from callers smaller than its head: with equal
    costs (every per="call" limit) whoever asks first when the window opens is admitted, as
    rule 1 says, so a queue of parked cost-1 waiters runs at its limit, not at their wake rate."""
    b.register(QueueConfig("q", retry=1.0, rate_limit="2/s"))
    start = clock()
    expect_admitted(admit(b, "q", "a"))
    expect_admitted(admit(b, "q", "b"))
    head = expect_denied(admit(b, "q", "w"), RATE)
    clock.set(start + 1.5)  # the head has waited more than a period; the window is open
    assert head.retry_at <= clock()
    expect_admitted(admit(b, "q", "n1"))  # same cost as the head: not kept out
    expect_admitted(admit(b, "q", "w"))


def check_settle_corrects_cost_windows(b: AdmissionBackend, clock: FakeClock) -> None:
    """settle corrects the charge in every per="cost" window, once; bad calls change nothing."""
    b.register(QueueConfig("q", rate_limit=["5/s", {"limit": 100, "period": 10, "per": "cost"}]))
    slot = expect_admitted(admit(b, "q", "t0", cost=80)).slot
    assert b.settle(slot.slot_id, 30) == -50
    assert [u.used for u in b.stats("q").rates] == [1, 30]
    before = b.stats("q")
    for bad in (-1, math.nan, math.inf, "5", None):
        _raises(SettleError, lambda bad=bad: b.settle(slot.slot_id, bad))  # type: ignore[misc]
    err = _raises(SettleError, lambda: b.settle(slot.slot_id, 10))
    assert "settled already" in str(err)
    _raises(SettleError, lambda: b.settle("q:999", 10))
    _raises(SettleError, lambda: b.settle("nope:1", 10))
    assert b.stats("q") == before, "refused settles change nothing"
    other = expect_admitted(admit(b, "q", "t1", cost=70)).slot
    assert b.settle(other.slot_id, 90) == 20, "an overdraft"
    assert b.stats("q").rates[1].used == 120
    expect_denied(admit(b, "q", "t2", cost=1), RATE)
    assert b.withdraw("q", "t2")
    b.release(slot.slot_id)
    _raises(SettleError, lambda: b.settle(slot.slot_id, 1))
    clock.advance(10)
    late = expect_admitted(admit(b, "q", "t3", cost=5)).slot
    clock.advance(10)  # the window rolled: a late settle of its charge changes nothing now
    expect_admitted(admit(b, "q", "t4", cost=95))
    assert b.settle(late.slot_id, 0) == -5
    assert b.stats("q").rates[1].used == 95


def check_a_refund_wakes_a_waiter(b: AdmissionBackend, clock: FakeClock) -> None:
    """A refund's room is offered at once: a queue without a cap grants its next waiter, one
    with a pending grant announces it again."""
    heard: list[Grant] = []
    sub = b.subscribe_grants(heard.append)
    try:
        b.register(QueueConfig("u", rate_limit={"limit": 100, "period": 60, "per": "cost"}))
        slot = expect_admitted(admit(b, "u", "a", cost=100)).slot
        expect_denied(admit(b, "u", "w", cost=40), RATE)
        assert b.pending_grants("u") == []
        b.settle(slot.slot_id, 50)
        assert [g.task_id for g in b.pending_grants("u")] == ["w"]
        expect_admitted(admit(b, "u", "w", cost=40))
        cfg = QueueConfig("c", concurrency=2,
                          rate_limit={"limit": 100, "period": 60, "per": "cost"})
        b.register(cfg)
        first = expect_admitted(admit(b, "c", "a", cost=60)).slot
        second = expect_admitted(admit(b, "c", "x", cost=30)).slot
        expect_denied(admit(b, "c", "w", cost=50), RATE)
        b.release(second.slot_id)  # granted to w, which the spent window holds back
        assert [g.task_id for g in b.pending_grants("c")] == ["w"]
        expect_denied(admit(b, "c", "w", cost=50), RATE)
        n = len([g for g in _heard(heard) if g.queue == "c"])
        b.settle(first.slot_id, 10)
        assert len([g for g in _heard(heard) if g.queue == "c"]) == n + 1, "announced again"
        mine = expect_admitted(admit(b, "c", "w", cost=50)).slot
        b.settle(mine.slot_id, 50)  # no refund: nobody woken
        assert len([g for g in _heard(heard) if g.queue == "c"]) == n + 1
    finally:
        sub.close()


def _heard(heard: list[Grant], timeout: float = 0.3) -> list[Grant]:
    import time

    time.sleep(timeout)  # announcements of another process arrive on their own
    return list(heard)


def check_backoff_pauses_a_queue_or_a_key(b: AdmissionBackend, clock: FakeClock) -> None:
    """backoff: nothing of the queue (or of the key) is admitted until it ends, fleet-wide."""
    b.register(QueueConfig("q", concurrency=5))
    start = clock()
    assert b.backoff("q", 30) == start + 30
    assert b.backoff("q", 10) == start + 30, "a shorter backoff does not shorten one in force"
    assert expect_denied(admit(b, "q", "t0"), BACKOFF).retry_at == start + 30
    assert b.stats("q").backoff_until == start + 30
    b.withdraw("q", "t0")
    clock.set(start + 30)
    expect_admitted(admit(b, "q", "t0"))
    assert b.stats("q").backoff_until is None
    assert b.backoff("q", 5, key="k") == start + 35
    assert expect_denied(admit(b, "q", "k0", key="k"), BACKOFF).retry_at == start + 35
    expect_admitted(admit(b, "q", "j0", key="j"))
    for bad in (0, -1, math.inf, math.nan, "5", 86_401):
        _raises(FlowControlConfigError, lambda bad=bad: b.backoff("q", bad))  # type: ignore[misc]
    _raises(UnknownQueueError, lambda: b.backoff("nope", 5))


def check_adaptive_limits(b: AdmissionBackend, clock: FakeClock) -> None:
    """adaptive: a backoff halves the live limit (once while one is in force); each period
    without one adds a tenth of the ceiling back, up to the ceiling."""
    b.register(QueueConfig("q", rate_limit={"limit": 20, "period": 10, "adaptive": True}))
    start = clock()
    assert b.stats("q").rates[0].live == 20
    b.backoff("q", 1)
    b.backoff("q", 1)
    assert b.stats("q").rates[0].live == 10, "a burst of backoffs is one signal"
    clock.set(start + 1)
    b.backoff("q", 1)
    assert b.stats("q").rates[0].live == 5
    clock.set(start + 2)
    admitted = [admit(b, "q", f"t{i}").admitted for i in range(6)]
    assert admitted == [True] * 5 + [False], "the live limit holds"
    clock.set(start + 11)
    assert b.stats("q").rates[0].live == 7
    clock.set(start + 31)
    assert b.stats("q").rates[0].live == 11
    clock.set(start + 200)
    assert b.stats("q").rates[0].live == 20, "never above the ceiling"


def check_rate_override(b: AdmissionBackend, clock: FakeClock) -> None:
    """An operator's rate limits win over config until reset, a config registered meanwhile
    included; bad values and unknown queues are refused."""
    b.register(QueueConfig("q", rate_limit="5/10s"))
    b.set_rate_limit("q", ["1/10s", {"limit": 50, "period": 60, "per": "cost"}])
    override = (RateLimit(1, 10.0), RateLimit(50, 60.0, per="cost"))
    s = b.stats("q")
    assert s.rate_override == override and s.rate_limit == override[0]
    assert [u.rate for u in s.rates] == list(override)
    expect_admitted(admit(b, "q", "a"))
    expect_denied(admit(b, "q", "b"), RATE)
    err = _raises(CostRefusedError, lambda: admit(b, "q", "c", cost=51))
    assert "50 per 60 s" in str(err), f"the refusal names the limit in force: {err}"
    b.register(QueueConfig("q", rate_limit="7/10s"))
    assert b.stats("q").rate_override == override, "a new config keeps the override"
    expect_denied(admit(b, "q", "b"), RATE)
    b.withdraw("q", "b")
    b.set_rate_limit("q", None)
    s = b.stats("q")
    assert s.rate_override is None and s.rate_limit == RateLimit(7, 10.0)
    expect_admitted(admit(b, "q", "b"))
    b.set_rate_limit("q", "2/s")
    assert b.stats("q").rate_override == (RateLimit(2, 1.0),)
    bad_values: tuple[object, ...] = ("fast", [], {"limit": 0, "period": 1}, 5)
    for bad in bad_values:
        err = _raises(FlowControlConfigError, functools.partial(b.set_rate_limit, "q", bad))
        assert err.queue == "q" and str(err.field).startswith("rate_limit")  # type: ignore[attr-defined]
    assert b.stats("q").rate_override == (RateLimit(2, 1.0),), "a refused value changes nothing"
    _raises(UnknownQueueError, lambda: b.set_rate_limit("nope", "1/s"))


QUOTA_CHECKS: list[Check] = [
    check_several_limits_at_once, check_costs_count_in_cost_windows, check_per_key_windows,
    check_a_key_its_windows_hold_takes_no_slot, check_a_rate_line_comes_back_turn_by_turn,
    check_a_waiter_no_window_admits_now_takes_no_grant,
    check_no_starvation_of_a_large_cost, check_a_caller_of_the_heads_cost_may_take_the_window,
    check_the_line_keeps_no_room_for_a_head_its_key_holds,
    check_settle_corrects_cost_windows,
    check_a_refund_wakes_a_waiter, check_backoff_pauses_a_queue_or_a_key, check_adaptive_limits,
    check_rate_override,
]
