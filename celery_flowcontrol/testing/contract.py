"""The admission conformance kit: one set of checks every backend must pass.

Usage, for a backend of your own::

    from celery_flowcontrol.testing import run_admission_backend_contract

    def make_backend(clock):
        # a fresh, empty backend whose clock is *clock* (a FakeClock: call it for "now")
        return MyBackend(clock=clock)

    def test_my_backend_keeps_the_contract():
        run_admission_backend_contract(make_backend)

or one pytest test per check::

    @pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__)
    def test_contract(check):
        run_check(check, make_backend)

Each check gets a fresh backend and a :class:`FakeClock` that starts on a whole second and
moves in whole milliseconds (backends that keep milliseconds are exact with it). The checks
read the backend's ``instance_ttl``, ``grant_ttl`` and ``waiter_ttl`` attributes.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ..admission.base import CONCURRENCY, PER_KEY, RATE, AdmissionBackend, Admitted, Grant, Ticket
from ..config import QueueConfig
from ..errors import FlowControlConfigError, InvalidTicketError, UnknownQueueError
from .contract_many import MANY_CHECKS
from .contract_quota import QUOTA_CHECKS
from .contract_rules import ORDER_CHECKS, RESTORE_CHECKS, RULE_CHECKS
from .contract_tenants import TENANT_CHECKS
from .support import FakeClock, admit, denied, expect_admitted, expect_denied

MakeBackend = Callable[[FakeClock], AdmissionBackend]
Check = Callable[[AdmissionBackend, FakeClock], None]


def check_register_and_lookup(b: AdmissionBackend, clock: FakeClock) -> None:
    """Registered queues are listed and their config read back; unknown ones raise."""
    b.register(QueueConfig("beta", concurrency=2))
    b.register(QueueConfig("alpha", rate_limit="5/s"))
    assert b.queues() == ["alpha", "beta"]
    assert b.get_config("beta") == QueueConfig("beta", concurrency=2)
    for call in (lambda: b.try_admit(Ticket("nope", "t1", "i1")), lambda: b.stats("nope"),
                 lambda: b.get_config("nope")):
        try:
            call()
        except UnknownQueueError as exc:
            assert exc.queue == "nope"
        else:
            raise AssertionError("an unknown queue must raise UnknownQueueError")
    assert b.unregister("alpha") is True
    assert b.unregister("alpha") is False
    assert b.queues() == ["beta"]
    slot = expect_admitted(admit(b, "beta", "t1")).slot
    assert b.unregister("beta", only_if_idle=True) is False, "a busy queue stays"
    b.release(slot.slot_id)
    assert b.unregister("beta", only_if_idle=True) is True
    assert b.queues() == []


def check_concurrency_cap(b: AdmissionBackend, clock: FakeClock) -> None:
    """No more than `concurrency` slots are busy; the rest are denied for concurrency."""
    b.register(QueueConfig("q", concurrency=3, retry=2.0))
    results = [admit(b, "q", f"t{i}") for i in range(5)]
    assert [r.admitted for r in results] == [True, True, True, False, False]
    d = expect_denied(results[3], CONCURRENCY)
    assert d.retry_at > clock(), "a concurrency denial retries later"
    s = b.stats("q")
    assert (s.in_use, s.granted, s.waiting, s.capacity) == (3, 0, 2, 3)


def check_unlimited_queue(b: AdmissionBackend, clock: FakeClock) -> None:
    """A queue with no cap admits everyone, and still tracks and frees slots."""
    b.register(QueueConfig("free"))
    slots = [expect_admitted(admit(b, "free", f"t{i}")).slot for i in range(50)]
    assert b.stats("free").in_use == 50
    assert all(b.release(s.slot_id) for s in slots)
    assert b.stats("free").in_use == 0


def check_release_idempotent(b: AdmissionBackend, clock: FakeClock) -> None:
    """Release frees a slot once; later, unknown or malformed ids return False."""
    b.register(QueueConfig("q", concurrency=1))
    slot = expect_admitted(admit(b, "q", "t1")).slot
    assert slot.queue == "q" and slot.task_id == "t1" and slot.holder == "i1"
    assert b.release(slot.slot_id) is True
    assert b.release(slot.slot_id) is False
    for bad in ("q:999", "nope:1", "garbage", "", "q:", ":1"):
        assert b.release(bad) is False, bad
    assert b.stats("q").in_use == 0
    expect_admitted(admit(b, "q", "t2"))


def check_readmission_is_idempotent(b: AdmissionBackend, clock: FakeClock) -> None:
    """A redelivered ticket (same task id) gets the slot it holds, not a second one: under a
    fresh id (a late release by the earlier delivery frees nothing), or, on a manual queue,
    under its id."""
    b.register(QueueConfig("q", concurrency=2))
    first = expect_admitted(admit(b, "q", "t1")).slot
    again = expect_admitted(admit(b, "q", "t1", instance="i2")).slot
    assert again.slot_id != first.slot_id and again.holder == "i2"
    assert (again.acquired_at, again.task_id) == (first.acquired_at, first.task_id)
    assert b.stats("q").in_use == 1
    assert b.release(first.slot_id) is False, "the earlier delivery's late release"
    assert [s.slot_id for s in b.busy_slots("q")] == [again.slot_id]
    assert b.release(again.slot_id) is True
    b.register(QueueConfig("m", concurrency=1, release="manual", max_hold=60))
    kept = expect_admitted(admit(b, "m", "t2")).slot
    assert expect_admitted(admit(b, "m", "t2", instance="i2")).slot.slot_id == kept.slot_id


def check_waiter_keeps_place(b: AdmissionBackend, clock: FakeClock) -> None:
    """A waiter that re-checks keeps its place in line and is not counted twice."""
    b.register(QueueConfig("q", concurrency=1))
    admit(b, "q", "t0")
    for i in (1, 2, 3):
        expect_denied(admit(b, "q", f"t{i}"), CONCURRENCY)
    clock.advance(1)
    expect_denied(admit(b, "q", "t1"), CONCURRENCY)
    assert [w.task_id for w in b.waiters("q")] == ["t1", "t2", "t3"]
    assert b.stats("q").waiting == 3


def check_grant_on_release(b: AdmissionBackend, clock: FakeClock) -> None:
    """A freed slot is granted to the next waiter, announced, and kept for it alone."""
    b.register(QueueConfig("q", concurrency=1))
    heard: list[Grant] = []
    sub = b.subscribe_grants(heard.append)
    try:
        slot = expect_admitted(admit(b, "q", "t1")).slot
        expect_denied(admit(b, "q", "t2"), CONCURRENCY)
        assert b.release(slot.slot_id)
        grants = b.pending_grants("q")
        assert [g.task_id for g in grants] == ["t2"]
        assert grants[0].expires_at == grants[0].granted_at + b.grant_ttl
        s = b.stats("q")
        assert (s.in_use, s.granted, s.waiting) == (0, 1, 0)
        expect_denied(admit(b, "q", "t3", priority=100), CONCURRENCY)
        confirmed = expect_admitted(admit(b, "q", "t2", instance="i9")).slot
        assert confirmed.slot_id == grants[0].slot_id and confirmed.holder == "i9"
        assert b.pending_grants() == []
        _wait_for(lambda: [g.task_id for g in heard] == ["t2"], "the grant was announced")
    finally:
        sub.close()


def check_capacity_override(b: AdmissionBackend, clock: FakeClock) -> None:
    """An override wins over config; raising grants at once, lowering takes nothing back."""
    b.register(QueueConfig("q", concurrency=2))
    slots = [expect_admitted(admit(b, "q", f"t{i}")).slot for i in range(2)]
    expect_denied(admit(b, "q", "w1"))
    expect_denied(admit(b, "q", "w2"))
    b.set_capacity("q", 1)
    s = b.stats("q")
    assert (s.capacity, s.concurrency, s.capacity_override, s.in_use) == (1, 2, 1, 2)
    b.release(slots[0].slot_id)
    assert b.pending_grants("q") == [], "below a lowered capacity nothing is granted"
    b.set_capacity("q", 4)
    assert [g.task_id for g in b.pending_grants("q")] == ["w1", "w2"]
    b.set_capacity("q", None)
    assert b.stats("q").capacity == 2 and b.stats("q").capacity_override is None
    for bad in (-1, 1.5, True, "3", 100_001):
        try:
            b.set_capacity("q", bad)  # type: ignore[arg-type]
        except FlowControlConfigError as exc:
            assert (exc.queue, exc.field) == ("q", "capacity")
        else:
            raise AssertionError(f"capacity override {bad!r} must be rejected")


def check_register_replaces(b: AdmissionBackend, clock: FakeClock) -> None:
    """Registering a queue again replaces its config and keeps its slots and waiters."""
    b.register(QueueConfig("q", concurrency=1))
    slot = expect_admitted(admit(b, "q", "t1")).slot
    expect_denied(admit(b, "q", "t2"))
    b.register(QueueConfig("q", concurrency=2))
    assert [g.task_id for g in b.pending_grants("q")] == ["t2"], "a raise grants at once"
    assert b.release(slot.slot_id)
    assert b.get_config("q").concurrency == 2


def check_instance_lapse(b: AdmissionBackend, clock: FakeClock) -> None:
    """Slots of an instance that stops heartbeating are free again after instance_ttl."""
    b.register(QueueConfig("q", concurrency=1))
    kept = expect_admitted(admit(b, "q", "t1", instance="alive")).slot
    clock.advance(b.instance_ttl * 0.6)
    b.heartbeat("alive")
    clock.advance(b.instance_ttl * 0.6)
    expect_denied(admit(b, "q", "t2", instance="other"), CONCURRENCY)
    assert b.busy_slots("q")[0].slot_id == kept.slot_id, "a heartbeat keeps slots alive"
    clock.advance(b.instance_ttl)
    b.heartbeat("other")
    report = b.reclaim()
    assert report.instances == 1, report
    assert b.release(kept.slot_id) is False
    assert [g.task_id for g in b.pending_grants("q")] == ["t2"]


def check_manual_slots_outlive_their_holder(b: AdmissionBackend, clock: FakeClock) -> None:
    """A manual queue's slot is not freed when its holder stops heartbeating; max_hold is."""
    b.register(QueueConfig("calls", concurrency=1, release="manual", max_hold="1h"))
    slot = expect_admitted(admit(b, "calls", "c1", instance="gone")).slot
    clock.advance(b.instance_ttl * 3)
    b.heartbeat("other")
    b.reclaim()
    expect_denied(admit(b, "calls", "c2", instance="other"), CONCURRENCY)
    clock.advance(3600)
    b.heartbeat("other")
    assert b.reclaim().max_hold == 1
    assert b.release(slot.slot_id) is False


def check_lazy_lapse(b: AdmissionBackend, clock: FakeClock) -> None:
    """Lapsed holders are freed by the next decision too, without a reclaim pass."""
    b.register(QueueConfig("q", concurrency=1))
    admit(b, "q", "t1", instance="dead")
    clock.advance(b.instance_ttl + 0.001)
    expect_admitted(admit(b, "q", "t2", instance="new"))


def check_max_hold(b: AdmissionBackend, clock: FakeClock) -> None:
    """A slot past max_hold is free again; an override applies to later slots only."""
    b.register(QueueConfig("q", concurrency=2, release="manual", max_hold=10))
    old = expect_admitted(admit(b, "q", "t1")).slot
    assert old.expires_at == old.acquired_at + 10
    b.set_max_hold("q", "1m")
    new = expect_admitted(admit(b, "q", "t2")).slot
    assert new.expires_at == new.acquired_at + 60
    s = b.stats("q")
    assert (s.max_hold, s.configured_max_hold, s.max_hold_override) == (60, 10, 60)
    clock.advance(10)
    b.heartbeat("i1")
    assert b.reclaim().max_hold == 1
    assert b.release(old.slot_id) is False
    assert b.release(new.slot_id) is True
    b.set_max_hold("q", None)
    assert b.stats("q").max_hold == 10
    try:
        b.set_max_hold("q", "31d")
    except FlowControlConfigError as exc:
        assert (exc.queue, exc.field) == ("q", "max_hold")
    else:
        raise AssertionError("a max_hold override over 30 days must be rejected")


def check_grant_expiry(b: AdmissionBackend, clock: FakeClock) -> None:
    """An unconfirmed grant passes to the next waiter; the late one goes back in line."""
    b.register(QueueConfig("q", concurrency=1))
    slot = expect_admitted(admit(b, "q", "t1")).slot
    expect_denied(admit(b, "q", "late"))
    expect_denied(admit(b, "q", "next"))
    b.release(slot.slot_id)
    assert [g.task_id for g in b.pending_grants("q")] == ["late"]
    clock.advance(b.grant_ttl + 0.001)
    assert b.reclaim().grants == 1
    assert [g.task_id for g in b.pending_grants("q")] == ["next"]
    assert [w.task_id for w in b.waiters("q")] == ["late"]
    expect_denied(admit(b, "q", "late"), CONCURRENCY)
    expect_admitted(admit(b, "q", "next"))


def check_waiter_pruning(b: AdmissionBackend, clock: FakeClock) -> None:
    """A waiter that does not come back within waiter_ttl after retry_at is pruned."""
    b.register(QueueConfig("q", concurrency=1))
    admit(b, "q", "t1")
    d = expect_denied(admit(b, "q", "gone"))
    clock.set(d.retry_at + b.waiter_ttl - 0.5)
    b.heartbeat("i1")
    assert b.reclaim().waiters == 0
    clock.advance(1)
    b.heartbeat("i1")
    assert b.reclaim().waiters == 1
    assert b.waiters("q") == []


def check_withdraw(b: AdmissionBackend, clock: FakeClock) -> None:
    """A withdrawn waiter leaves the line; a withdrawn grant passes to the next waiter."""
    b.register(QueueConfig("q", concurrency=1))
    slot = expect_admitted(admit(b, "q", "t1")).slot
    for t in ("a", "b", "c"):
        admit(b, "q", t)
    assert b.withdraw("q", "b") is True
    assert b.withdraw("q", "b") is False
    assert [w.task_id for w in b.waiters("q")] == ["a", "c"]
    b.release(slot.slot_id)
    assert b.withdraw("q", "a") is True
    assert [g.task_id for g in b.pending_grants("q")] == ["c"]


def check_bad_tickets(b: AdmissionBackend, clock: FakeClock) -> None:
    """Bad per-call input is refused before any backend sees it, naming the field."""
    cases: list[tuple[dict[str, object], str]] = [({"priority": "1"}, "priority"), ({"priority": 1.5}, "priority"),
             ({"priority": True}, "priority"), ({"priority": 10**9}, "priority"),
             ({"fairness_key": "k" * 257}, "fairness_key"), ({"fairness_key": 7}, "fairness_key"),
             ({"task_id": ""}, "task_id"), ({"label": "x" * 300}, "label")]
    for kwargs, field in cases:
        args: dict[str, object] = {"queue": "q", "task_id": "t", "instance": "i", **kwargs}
        try:
            Ticket(**args)  # type: ignore[arg-type]
        except InvalidTicketError as exc:
            assert exc.field == field and exc.queue == "q", (kwargs, exc)
        else:
            raise AssertionError(f"{kwargs} must be refused")
    b.register(QueueConfig("q", concurrency=1))
    expect_admitted(admit(b, "q", "t", key="k" * 256, label="é" * 128))


def check_cap_holds_under_random_ops(b: AdmissionBackend, clock: FakeClock) -> None:
    """Whatever the sequence, busy + granted never exceeds the capacity."""
    rng = random.Random(7)
    b.register(QueueConfig("q", concurrency=4, per_key_concurrency=2, fairness="key"))
    held: list[str] = []
    for step in range(400):
        op = rng.random()
        if op < 0.55:
            r = admit(b, "q", f"t{rng.randrange(60)}", key=f"k{rng.randrange(5)}",
                      priority=rng.randrange(3))
            if isinstance(r, Admitted) and r.slot.slot_id not in held:
                held.append(r.slot.slot_id)
        elif op < 0.85 and held:
            b.release(held.pop(rng.randrange(len(held))))
        elif op < 0.95:
            clock.advance(rng.random() * 3)
            b.heartbeat("i1")
        else:
            b.reclaim()
        s = b.stats("q")
        assert s.in_use + s.granted <= 4, (step, s)
        per_key: dict[str, int] = {}
        for slot in b.busy_slots("q"):
            per_key[slot.fairness_key] = per_key.get(slot.fairness_key, 0) + 1
        assert max(per_key.values(), default=0) <= 2, (step, per_key)


def _wait_for(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


CONTRACT_CHECKS: list[Check] = [
    check_register_and_lookup, check_concurrency_cap, check_unlimited_queue,
    check_release_idempotent, check_readmission_is_idempotent, check_waiter_keeps_place,
    check_grant_on_release, check_capacity_override, check_register_replaces,
    check_instance_lapse, check_manual_slots_outlive_their_holder, check_lazy_lapse, check_max_hold, check_grant_expiry,
    check_waiter_pruning, check_withdraw, check_bad_tickets, check_cap_holds_under_random_ops,
    *ORDER_CHECKS, *RULE_CHECKS, *RESTORE_CHECKS, *QUOTA_CHECKS, *TENANT_CHECKS,
    *MANY_CHECKS,
]


def run_check(check: Check, make_backend: MakeBackend) -> None:
    """Run one check against a fresh backend; closes it afterwards."""
    clock = FakeClock()
    backend = make_backend(clock)
    try:
        check(backend, clock)
    finally:
        backend.close()


def run_admission_backend_contract(make_backend: MakeBackend) -> list[str]:
    """Run every check; raise AssertionError naming the first that fails. Returns the names."""
    for check in CONTRACT_CHECKS:
        try:
            run_check(check, make_backend)
        except AssertionError as exc:
            raise AssertionError(f"{check.__name__}: {check.__doc__}\n{exc}") from exc
    return [c.__name__ for c in CONTRACT_CHECKS]


__all__ = ["CONTRACT_CHECKS", "FakeClock", "PER_KEY", "RATE", "denied", "run_admission_backend_contract", "run_check"]
