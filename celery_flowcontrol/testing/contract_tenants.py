"""Contract checks for unequal tenants: weights (weighted fair queueing), per-key overrides
from ``keys=`` and ``set_key``, reserves, bounded waiting, pauses, and the keys an operator
reads. Collected by :mod:`.contract`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..admission.base import (
    CONCURRENCY,
    PAUSED,
    PER_KEY,
    AdmissionBackend,
    Decision,
    Refused,
)
from ..config import QueueConfig, RateLimit
from ..errors import CostRefusedError, FlowControlConfigError, FlowQueueFull
from .support import FakeClock, admit, expect_admitted, expect_denied

Check = Callable[[AdmissionBackend, FakeClock], None]


def _serve(b: AdmissionBackend, queue: str, slot_id: str, n: int | None = None) -> list[str]:
    """Release *slot_id*, confirm each grant in turn (up to *n*); the task ids served."""
    served: list[str] = []
    while n is None or len(served) < n:
        b.release(slot_id)
        grants = b.pending_grants(queue)
        if not grants:
            break
        served.append(grants[0].task_id)
        slot_id = expect_admitted(admit(b, queue, grants[0].task_id)).slot.slot_id
    return served


def _refused(decision: Decision, field: str, bound: int) -> Refused:
    assert isinstance(decision, Refused), f"expected a refusal, got {decision}"
    assert (decision.field, decision.bound) == (field, bound), decision
    err = decision.error()
    assert isinstance(err, FlowQueueFull) and err.field == field and err.bound == bound
    return decision


def _flood(b: AdmissionBackend, queue: str, keys: dict[str, int]) -> None:
    """Make *keys[k]* waiters of each key k, interleaved (k0-0, k1-0, ..., k0-1, ...)."""
    for i in range(max(keys.values())):
        for key, n in keys.items():
            if i < n:
                admit(b, queue, f"{key}-{i}", key=key)


def share_error(served: list[str], weights: dict[str, float]) -> float:
    """The worst unfairness of a serving order *served* (keys, all backlogged throughout), in
    admissions: over every stretch and every two keys i, j, how far i's admissions per unit
    of weight are from j's, as a share of one admission of each (1/w_i + 1/w_j). Weighted
    fair queueing keeps it at most 1: within one admission per key."""
    worst = 0.0
    keys = list(weights)
    for i in keys:
        for j in keys:
            if i == j:
                continue
            # gap(s, e) = D(e) - D(s), D(t) = i's admissions / w_i - j's / w_j by t: its
            # largest is D(e) less the least D before e, in one pass.
            d = low = 0.0
            unit = 1 / weights[i] + 1 / weights[j]
            for key in served:
                d += (key == i) / weights[i] - (key == j) / weights[j]
                low = min(low, d)
                worst = max(worst, (d - low) / unit)
    return worst


def fluid_gap(served: list[str], weights: dict[str, float]) -> float:
    """The worst gap, in admissions, of a key's count from its fluid share (n * w / W after n
    admissions, W the sum of the weights) over every prefix of *served* (keys, all backlogged
    from the start). A start-tag order reaches (N - 1) * w / W for a heavy key served last of
    the first round; the queue's midpoint order keeps any key of at most the mean weight
    within one admission."""
    total, counts, worst = sum(weights.values()), dict.fromkeys(weights, 0), 0.0
    for n, key in enumerate(served, 1):
        counts[key] += 1
        worst = max(worst, max(abs(counts[k] - n * w / total) for k, w in weights.items()))
    return worst


def check_weights_share_by_weight(b: AdmissionBackend, clock: FakeClock) -> None:
    """While keys stay backlogged each is served in proportion to its weight, within one
    admission per key over any stretch (:func:`share_error`), and waiters() lists that
    order."""
    b.register(QueueConfig("q", concurrency=1, fairness="key",
                           keys={"a": {"weight": 3}, "c": {"weight": 0.5}}))
    first = expect_admitted(admit(b, "q", "x")).slot
    _flood(b, "q", {"a": 30, "b": 30, "c": 30})
    listed = [w.task_id for w in b.waiters("q", limit=90)]
    served = _serve(b, "q", first.slot_id, 36)
    assert served == listed[:36]
    keys = [task.split("-")[0] for task in served]
    assert share_error(keys, {"a": 3.0, "b": 1.0, "c": 0.5}) <= 1 + 1e-9, served
    assert fluid_gap(keys, {"a": 3.0, "b": 1.0, "c": 0.5}) <= 1, served
    assert (keys.count("a"), keys.count("b"), keys.count("c")) == (24, 8, 4), served


def check_a_heavy_key_is_not_held_a_round(b: AdmissionBackend, clock: FakeClock) -> None:
    """Keys that start waiting together are each let in as their weight says: a key of twice
    the weight of nine others, arriving last, is served first, not after a round of the nine
    (within one admission of its fluid share n * w / W at every count)."""
    weights = {**{f"s{i}": 1.0 for i in range(9)}, "h": 2.0}
    b.register(QueueConfig("q", concurrency=1, fairness="key", keys={"h": {"weight": 2}}))
    first = expect_admitted(admit(b, "q", "x")).slot
    _flood(b, "q", dict.fromkeys(weights, 12))
    keys = [task.rsplit("-", 1)[0] for task in _serve(b, "q", first.slot_id, 60)]
    assert fluid_gap(keys, weights) <= 1, keys
    assert share_error(keys, weights) <= 1 + 1e-9, keys
    assert keys[0] == "h" and keys[10:12] == ["h", "h"], keys


def check_a_newcomer_takes_no_burst(b: AdmissionBackend, clock: FakeClock) -> None:
    """A heavy key that starts waiting just after a light key was served starts at the
    virtual time that admission reached: it shares with the keys already waiting from its
    first admission on (within one admission per key over the stretch), it does not run a
    burst ahead of them."""
    weights = {"light": 0.2, "b": 1.0, "heavy": 5.0}
    b.register(QueueConfig("q", concurrency=1, fairness="key",
                           keys={"light": {"weight": 0.2}, "heavy": {"weight": 5}}))
    first = expect_admitted(admit(b, "q", "x")).slot
    _flood(b, "q", {"light": 10, "b": 40})
    served = _serve(b, "q", first.slot_id, 3)
    assert served == ["b-0", "b-1", "light-0"], served
    _flood(b, "q", {"heavy": 40})
    slot = b.busy_slots("q")[0].slot_id
    keys = [task.rsplit("-", 1)[0] for task in _serve(b, "q", slot, 30)]
    assert share_error(keys, weights) <= 1 + 1e-9, keys
    assert keys[:6].count("b") >= 1, keys


def check_no_credit_for_time_away(b: AdmissionBackend, clock: FakeClock) -> None:
    """A key that starts waiting late starts at the current virtual time: it alternates
    with the keys served meanwhile, it does not take their past share at once."""
    b.register(QueueConfig("q", concurrency=1, fairness="key"))
    first = expect_admitted(admit(b, "q", "x")).slot
    _flood(b, "q", {"a": 20})
    served = _serve(b, "q", first.slot_id, 10)
    assert served == [f"a-{i}" for i in range(10)]
    _flood(b, "q", {"late": 5})
    slot = b.busy_slots("q")[0].slot_id
    nxt = _serve(b, "q", slot, 6)
    assert nxt == ["late-0", "a-10", "late-1", "a-11", "late-2", "a-12"], nxt


def check_a_grant_answers_for_its_waiters_key_cost(b: AdmissionBackend,
                                                   clock: FakeClock) -> None:
    """A grant is confirmed under the limits of the key its waiter asked with: a confirming
    call of another key whose cost that key's per-cost limit can never admit is refused
    (CostRefusedError), never admitted past the limit; the grant stays for a call that fits."""
    b.register(QueueConfig("q", concurrency=1, keys={
        "k2": {"rate_limit": {"limit": 4, "period": 2, "per": "cost"}}}))
    first = expect_admitted(admit(b, "q", "x")).slot
    expect_denied(admit(b, "q", "t2", key="k2"), CONCURRENCY)
    b.release(first.slot_id)
    assert [g.task_id for g in b.pending_grants("q")] == ["t2"]
    try:
        admit(b, "q", "t2", key="", cost=7)
        raise AssertionError("a cost the grant's key can never admit was admitted")
    except CostRefusedError:
        pass
    assert [g.task_id for g in b.pending_grants("q")] == ["t2"]
    assert expect_admitted(admit(b, "q", "t2", key="k2", cost=4)).slot.fairness_key == "k2"


def check_key_overrides_from_config(b: AdmissionBackend, clock: FakeClock) -> None:
    """keys= gives a key its own concurrency and rate limit instead of the per-key ones."""
    b.register(QueueConfig("q", concurrency=10, fairness="key", per_key_concurrency=1,
                           per_key_rate_limit="2/s",
                           keys={"big": {"concurrency": 3, "rate_limit": "5/s"}}))
    assert [admit(b, "q", f"big{i}", key="big").admitted for i in range(4)] == [
        True, True, True, False]
    expect_denied(admit(b, "q", "big9", key="big"), PER_KEY)
    assert [admit(b, "q", f"s{i}", key="small").admitted for i in range(2)] == [True, False]
    b.register(QueueConfig("q", concurrency=10, fairness="key", per_key_rate_limit="2/s",
                           keys={"big": {"rate_limit": "5/s"}}))
    assert [admit(b, "q", f"r{i}", key="big").admitted for i in range(3)] == [True, True, False]
    assert b.get_config("q").keys["big"].rate_limit == RateLimit(5, 1)


def check_set_key_overrides_until_reset(b: AdmissionBackend, clock: FakeClock) -> None:
    """set_key wins over keys= until reset_key, is checked as config is, and a raised cap
    grants at once."""
    b.register(QueueConfig("q", concurrency=10, fairness="key", per_key_concurrency=1,
                           keys={"k": {"weight": 2}}))
    expect_admitted(admit(b, "q", "k0", key="k"))
    expect_denied(admit(b, "q", "k1", key="k"), PER_KEY)
    settings = b.set_key("q", "k", concurrency=2, reserve=1)
    assert (settings.weight, settings.concurrency, settings.reserve) == (2.0, 2, 1)
    assert [g.task_id for g in b.pending_grants("q")] == ["k1"]
    for bad, field in (({"weight": 0}, "weight"), ({"reserve": 3}, "reserve"),
                       ({"max_waiting": 0}, "max_waiting"), ({"colour": 1}, "colour")):
        try:
            b.set_key("q", "k", **bad)
        except FlowControlConfigError as err:
            assert (err.queue, err.field) == ("q", f"keys['k'].{field}"), err
        else:
            raise AssertionError(f"set_key accepted {bad}")
    stats = {s.key: s for s in b.key_stats("q")}
    assert stats["k"].concurrency == 2 and stats["k"].overridden and stats["k"].weight == 2
    assert b.set_key("q", "k", concurrency=None).concurrency is None
    b.reset_key("q", "k")
    expect_admitted(admit(b, "q", "k1", key="k"))  # its grant stays its own
    expect_denied(admit(b, "q", "k2", key="k"), PER_KEY)
    stats = {s.key: s for s in b.key_stats("q")}
    assert stats["k"].concurrency == 1 and stats["k"].weight == 2 and stats["k"].overridden


def check_reserve_serves_a_newcomer_first(b: AdmissionBackend, clock: FakeClock) -> None:
    """A freed slot goes first to a waiting key below its reserve, whatever its weight."""
    b.register(QueueConfig("q", concurrency=2, fairness="key",
                           keys={"new": {"reserve": 1, "weight": 0.001}}))
    slots = [expect_admitted(admit(b, "q", f"x{i}", key="flood")).slot for i in range(2)]
    _flood(b, "q", {"flood": 20, "other": 20})
    _flood(b, "q", {"new": 2})
    assert [w.task_id for w in b.waiters("q", limit=3)][0] == "new-0"
    b.release(slots[0].slot_id)
    assert [g.task_id for g in b.pending_grants("q")] == ["new-0"]
    expect_admitted(admit(b, "q", "new-0", key="new"))
    b.release(slots[1].slot_id)
    assert [g.task_id for g in b.pending_grants("q")][-1] != "new-1"  # at its reserve now


def check_reserve_keeps_no_slot_idle(b: AdmissionBackend, clock: FakeClock) -> None:
    """A reserve is work-conserving: with its key idle, others take every slot."""
    b.register(QueueConfig("q", concurrency=3, fairness="key", per_key_reserve=2))
    assert [admit(b, "q", f"a{i}", key="a").admitted for i in range(4)] == [
        True, True, True, False]


def check_new_key_settings_count_at_once(b: AdmissionBackend, clock: FakeClock) -> None:
    """Settings given to keys that wait (register's keys= or per_key_reserve, set_key) count
    from the next decision: each waiting line is placed again by its key's reserve and weight."""
    changes: list[tuple[str, dict[str, Any] | None]] = [
               ("fifo", {"keys": {"k": {"reserve": 1}}}),  # and lines per key from now on
               ("key", {"keys": {"k": {"reserve": 1}}}),
               ("key", {"per_key_reserve": 1}),
               ("fifo", {"fairness": "key", "per_key_reserve": 2}),
               ("key", {"keys": {"k": {"weight": 4}}}),     # k's rank 0.125, ""'s 0.5
               ("key", None)]                               # set_key(weight=4)
    for i, (fairness, change) in enumerate(changes):
        q = f"q{i}"
        b.register(QueueConfig(q, concurrency=2, fairness=fairness))
        # Key "" (also the name of the one line a queue keeps while keys are not told apart)
        # holds both slots, at its reserve in every case, and waits first.
        for task in ("x0", "x1"):
            expect_admitted(admit(b, q, task))
        _flood(b, q, {"": 1, "k": 1})
        if change is None:
            b.set_key(q, "k", weight=4)
        else:
            b.register(QueueConfig(q, concurrency=2, **{"fairness": fairness, **change}))
        assert [w.task_id for w in b.waiters(q)] == ["k-0", "-0"], (fairness, change)
        b.set_capacity(q, 3)
        assert [g.task_id for g in b.pending_grants(q)] == ["k-0"], (fairness, change)


def check_bounded_waiting_refuses(b: AdmissionBackend, clock: FakeClock) -> None:
    """A call that would make more than max_waiting wait (queue, or its key's bound) is
    refused with FlowQueueFull; it holds nothing and is not in line; a waiter's re-check is
    never refused."""
    b.register(QueueConfig("q", concurrency=1, fairness="key", max_waiting=4,
                           per_key_max_waiting=2, keys={"vip": {"max_waiting": 3}}))
    expect_admitted(admit(b, "q", "run", key="a"))
    expect_denied(admit(b, "q", "a1", key="a"), CONCURRENCY)
    expect_denied(admit(b, "q", "a2", key="a"), CONCURRENCY)
    assert isinstance(b.would_refuse("q", "a"), FlowQueueFull)
    assert b.would_refuse("q", "b") is None
    refused = _refused(admit(b, "q", "a3", key="a"), "per_key_max_waiting", 2)
    assert (refused.queue, refused.key) == ("q", "a")
    expect_denied(admit(b, "q", "a1", key="a"), CONCURRENCY)  # a re-check keeps its place
    expect_denied(admit(b, "q", "v1", key="vip"))
    expect_denied(admit(b, "q", "v2", key="vip"))
    _refused(admit(b, "q", "v3", key="vip"), "max_waiting", 4)
    assert [w.task_id for w in b.waiters("q")] == ["a1", "v1", "a2", "v2"]
    stats = b.stats("q")
    assert (stats.waiting, stats.max_waiting, stats.refused) == (4, 4, 2)
    b.register(QueueConfig("q", concurrency=1, fairness="key", per_key_max_waiting=2,
                           keys={"vip": {"max_waiting": 3}}))
    expect_denied(admit(b, "q", "v3", key="vip"))
    _refused(admit(b, "q", "v4", key="vip"), "keys['vip'].max_waiting", 3)
    assert "a3" not in {w.task_id for w in b.waiters("q")}


def check_waiting_bounded_sees_run_time_bounds(b: AdmissionBackend, clock: FakeClock) -> None:
    """waiting_bounded (what a producer reads before it asks would_refuse) is true where a
    bound holds: the config's, or a key's set_key override until reset_key."""
    b.register(QueueConfig("q", concurrency=1, fairness="key", keys={"a": {"weight": 2}}))
    b.register(QueueConfig("cfg", concurrency=1, fairness="key", keys={"v": {"max_waiting": 2}}))
    assert not b.waiting_bounded("q") and b.waiting_bounded("cfg")
    b.set_key("q", "a", weight=3)
    assert not b.waiting_bounded("q"), "a weight is no bound"
    b.set_key("q", "b", max_waiting=1)
    assert b.waiting_bounded("q")
    expect_admitted(admit(b, "q", "run", key="b"))
    expect_denied(admit(b, "q", "b1", key="b"))
    assert isinstance(b.would_refuse("q", "b"), FlowQueueFull)
    b.set_key("q", "b", max_waiting=None)
    assert not b.waiting_bounded("q"), "the override's bound dropped"
    b.set_key("q", "a", max_waiting=5)
    b.reset_key("q", "a")
    assert not b.waiting_bounded("q")
    b.register(QueueConfig("q", concurrency=1, fairness="key", max_waiting=9))
    assert b.waiting_bounded("q")


def check_pause_a_queue(b: AdmissionBackend, clock: FakeClock) -> None:
    """A paused queue admits nothing and grants nothing, keeps its waiters in order, and
    serves them in that order once resumed; a pause with an end ends by itself."""
    b.register(QueueConfig("q", concurrency=2))
    running = expect_admitted(admit(b, "q", "run")).slot
    b.pause("q")
    assert b.stats("q").paused_until == math.inf
    expect_denied(admit(b, "q", "w1"), PAUSED)
    expect_denied(admit(b, "q", "w2"), PAUSED)
    b.release(running.slot_id)
    assert b.pending_grants("q") == []
    assert [w.task_id for w in b.waiters("q")] == ["w1", "w2"]
    b.resume("q")
    assert b.stats("q").paused_until is None
    assert [g.task_id for g in b.pending_grants("q")] == ["w1", "w2"]
    until = clock() + 5
    b.pause("q", until=until)
    denial = expect_denied(admit(b, "q", "w3"), PAUSED)
    assert denial.retry_at == until
    clock.set(until)
    expect_admitted(admit(b, "q", "w1"))


def check_pause_a_key(b: AdmissionBackend, clock: FakeClock) -> None:
    """A paused key admits nothing; its grant passes to the next waiter not paused, and its
    waiters keep their places until resumed; a key backoff shows as that key's pause."""
    b.register(QueueConfig("q", concurrency=1, fairness="key"))
    running = expect_admitted(admit(b, "q", "run", key="x")).slot
    expect_denied(admit(b, "q", "a1", key="a"))
    expect_denied(admit(b, "q", "b1", key="b"))
    b.release(running.slot_id)
    assert [g.task_id for g in b.pending_grants("q")] == ["a1"]
    b.pause("q", key="a")
    expect_denied(admit(b, "q", "a1", key="a"), PAUSED)  # its grant passes on
    assert [g.task_id for g in b.pending_grants("q")] == ["b1"]
    expect_denied(admit(b, "q", "a2", key="a"), PAUSED)
    slot = expect_admitted(admit(b, "q", "b1", key="b")).slot
    b.release(slot.slot_id)
    assert b.pending_grants("q") == []
    stats = {s.key: s for s in b.key_stats("q")}
    assert stats["a"].paused_until == math.inf and stats["a"].waiting == 2
    b.resume("q", key="a")
    assert [g.task_id for g in b.pending_grants("q")] == ["a1"]
    until = b.backoff("q", 30, key="z")
    assert {s.key: s for s in b.key_stats("q")}["z"].paused_until == until


def check_key_stats_show_the_busiest_keys(b: AdmissionBackend, clock: FakeClock) -> None:
    """key_stats lists keys by busy + waiting, with their settings and recent admissions."""
    b.register(QueueConfig("q", concurrency=3, fairness="key", per_key_concurrency=2,
                           keys={"gold": {"weight": 4, "reserve": 1}}))
    for i in range(2):
        expect_admitted(admit(b, "q", f"g{i}", key="gold"))
    expect_admitted(admit(b, "q", "s0", key="silver"))
    expect_denied(admit(b, "q", "g2", key="gold"))
    rows = b.key_stats("q")
    assert [r.key for r in rows] == ["gold", "silver"]
    gold, silver = rows
    assert (gold.busy, gold.waiting, gold.weight, gold.concurrency, gold.reserve) == (
        2, 1, 4.0, 2, 1)
    assert gold.overridden and not silver.overridden
    assert (silver.busy, silver.waiting, silver.weight) == (1, 0, 1.0)
    assert (gold.admitted_recent, silver.admitted_recent) == (2, 1)
    assert b.key_stats("q", limit=1) == rows[:1]


TENANT_CHECKS: list[Check] = [
    check_weights_share_by_weight, check_a_heavy_key_is_not_held_a_round,
    check_a_newcomer_takes_no_burst, check_no_credit_for_time_away,
    check_a_grant_answers_for_its_waiters_key_cost,
    check_key_overrides_from_config, check_set_key_overrides_until_reset,
    check_reserve_serves_a_newcomer_first, check_reserve_keeps_no_slot_idle,
    check_new_key_settings_count_at_once,
    check_bounded_waiting_refuses, check_waiting_bounded_sees_run_time_bounds,
    check_pause_a_queue, check_pause_a_key,
    check_key_stats_show_the_busiest_keys,
]
