"""Slots that outlive a task, on real prefork workers, the Redis admission backend and SQL parking:
manual release from anywhere, max_hold, acquire_slot timeouts, operator overrides, and grants
whose waiter's worker died."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from celery_flowcontrol import FlowControl, SlotTimeoutError, release_slot
from tests.support.harness import REPO, max_overlap, wait_for
from tests.support.projects.slots import SlotsHarness

MakeSlots = Callable[..., SlotsHarness]

RELEASE_SCRIPT = (
    "import sys\n"
    "from proj import app\n"
    "from celery_flowcontrol import release_slot\n"
    "print('released=%s' % release_slot(sys.argv[1], app=app).released)\n"
)


def release_in_subprocess(h: SlotsHarness, slot_id: str) -> bool:
    """``release_slot`` from a separate Python process with the app configured (a webhook)."""
    env = {**os.environ, **h.env, "PYTHONPATH": os.pathsep.join([str(h.workdir), str(REPO)])}
    out = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", RELEASE_SCRIPT, slot_id],
        cwd=h.workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    line = out.stdout.strip().splitlines()[-1]
    assert line in ("released=True", "released=False"), out.stdout + out.stderr
    return line == "released=True"


def queue_state(h: SlotsHarness, queue: str) -> str:
    """What the backend and the parking table hold for *queue*, for a failure message."""
    b = h.backend()
    rows = [(m.task_id, m.reason, round(m.wake_at - time.time(), 2)) for m in h.store().list(queue)]
    return (
        f"busy {[(s.slot_id, s.task_id) for s in b.busy_slots(queue)]}, "
        f"waiters {[(w.task_id, w.instance) for w in b.waiters(queue)]}, "
        f"grants {[(g.task_id, g.slot_id) for g in b.pending_grants(queue)]}, parked {rows}"
    )


def slot_ids(h: SlotsHarness) -> dict[str, str]:
    """label -> slot id, as ``proj.place`` recorded them."""
    return dict(entry.split("|", 1) for entry in h.listed("slots"))


@pytest.mark.timeout(60)
@pytest.mark.gated("calls")
def test_manual_slot_released_from_another_task_and_from_another_process(make_slots: MakeSlots) -> None:
    """Capacity 2, release="manual". Two calls take both slots and keep them after they return;
    a third is parked. Released by a task (the webhook's), then by a separate process, each
    release admits the next waiter; a second release of either slot returns False."""
    queue = {"name": "calls", "concurrency": 2, "release": "manual", "max_hold": "60s"}
    h = make_slots(conf={"flowcontrol_queues": [queue]})
    h.start_worker(3)
    h.send("place", "c0", flow_queue="calls")
    h.send("place", "c1", flow_queue="calls")
    wait_for(lambda: len(slot_ids(h)) == 2, 20, what="two calls to take their slots")
    h.send("place", "c2", flow_queue="calls")
    wait_for(lambda: h.parked("calls") == 1, 20, what="the third call to be parked")
    time.sleep(0.5)
    assert len(h.backend().busy_slots("calls")) == 2, "a manual slot was released when its task returned"
    ids = slot_ids(h)
    assert "c2" not in ids and ids["c0"] != ids["c1"]

    h.send("release", ids["c0"])
    wait_for(lambda: "c2" in slot_ids(h), 10, what="the waiter to get the slot the task released")
    assert h.listed("released") == [f"{ids['c0']}|1"]

    h.send("place", "c3", flow_queue="calls")
    wait_for(lambda: h.parked("calls") == 1, 20, what="a fourth call to be parked")
    assert release_in_subprocess(h, ids["c1"]) is True
    wait_for(lambda: "c3" in slot_ids(h), 10, what="the waiter to get the slot the process released")

    # Idempotent: a second release, from a task or a process, changes nothing.
    h.send("release", ids["c0"])
    wait_for(lambda: len(h.listed("released")) == 2, 10, what="the second release task")
    assert h.listed("released")[1] == f"{ids['c0']}|0"
    assert release_in_subprocess(h, ids["c1"]) is False
    busy = {s.slot_id for s in h.backend().busy_slots("calls")}
    assert busy == {slot_ids(h)["c2"], slot_ids(h)["c3"]}


@pytest.mark.timeout(60)
@pytest.mark.gated("calls")
def test_release_after_max_hold_expiry_returns_false(make_slots: MakeSlots) -> None:
    """max_hold 2 s, reclaim every 0.3 s: an unreleased slot is taken back by the reclaim pass
    (the parked waiter gets it), and the late release returns False."""
    queue = {"name": "calls", "concurrency": 1, "release": "manual", "max_hold": "2s", "retry": "30s"}
    h = make_slots(conf={"flowcontrol_queues": [queue], "flowcontrol_reclaim_interval": 0.3})
    h.start_worker(2)
    h.send("place", "c0", flow_queue="calls")
    wait_for(lambda: "c0" in slot_ids(h), 20, what="the call to take the slot")
    taken = time.time()
    h.send("place", "c1", flow_queue="calls")
    wait_for(lambda: h.parked("calls") == 1, 20, what="the second call to be parked")
    wait_for(lambda: "c1" in slot_ids(h), 10, what="max_hold to take the slot back for the waiter")
    assert time.time() - taken >= 2.0
    ids = slot_ids(h)
    assert release_slot(ids["c0"], app=h.app).released is False
    assert [s.slot_id for s in h.backend().busy_slots("calls")] == [ids["c1"]]


@pytest.mark.timeout(60)
def test_acquire_slot_timeout_raises_and_leaves_no_waiter(make_slots: MakeSlots) -> None:
    """The only "exports" slot is held; ``acquire_slot("exports", timeout=2)`` parks its task,
    which runs again after 2 s and raises SlotTimeoutError (as the task's result). No waiter is
    left behind, and the task body ran exactly twice (before parking, and at the timeout)."""
    h = make_slots(results=True, conf={"flowcontrol_queues": [{"name": "exports", "concurrency": 1}]})
    h.start_worker(2)
    h.send("gate", "holder", flow_queue="exports")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the holder to start")
    sent = time.time()
    result = h.app.tasks["proj.acquire"].apply_async(("late", "exports", 2.0))
    wait_for(lambda: len(h.backend().waiters("exports")) == 1, 10, what="the acquire to wait in line")
    result.get(timeout=20, propagate=False)
    elapsed = time.time() - sent
    exc = result.result
    assert result.failed() and SlotTimeoutError.is_(exc), repr(exc)
    assert 2.0 <= elapsed < 6.0, f"timed out after {elapsed:.2f} s (timeout 2 s)"
    assert h.backend().waiters("exports") == []
    assert h.listed("acquire-runs") == ["late", "late"]
    assert "late" not in h.gauge.runs()
    assert h.parked("exports") == 0
    h.gauge.open_gate()


@pytest.mark.timeout(60)
@pytest.mark.gated("cap")
def test_capacity_raise_admits_parked_waiters_at_once_and_lowering_takes_nothing_back(make_slots: MakeSlots) -> None:
    """Capacity 1 with three parked waiters (retry 30 s, so only a grant can wake them): raised
    to 4, all three run within 1 s. Lowered to 1 with 4 running, none is stopped or released,
    and a newcomer waits until they are done."""
    queue = {"name": "cap", "concurrency": 1, "retry": "30s"}
    h = make_slots(conf={"flowcontrol_queues": [queue]})
    h.start_worker(5)
    h.send("gate", "g0", flow_queue="cap")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the first gate task to start")
    for i in (1, 2, 3):
        h.send("gate", f"g{i}", flow_queue="cap")
    wait_for(lambda: h.parked("cap") == 3, 20, what="three waiters to be parked")
    control = FlowControl(h.app)
    raised = time.time()
    control.set_capacity("cap", 4)
    wait_for(lambda: h.gauge.started() == 4, 5, 0.02, what="the waiters to run after the raise")
    lag = max(r.start for r in h.gauge.executions()) - raised
    assert lag <= 1.0, f"the last waiter started {lag:.2f} s after the raise"

    control.set_capacity("cap", 1)
    h.send("gate", "g4", flow_queue="cap")
    wait_for(lambda: h.parked("cap") == 1, 20, what="a newcomer to be parked under the lower cap")
    time.sleep(0.5)
    assert h.gauge.inflight() == 4 and len(h.backend().busy_slots("cap")) == 4
    assert h.backend().stats("cap").capacity == 1
    h.gauge.open_gate()
    done = h.wait_done([f"g{i}" for i in range(5)], timeout=20)
    assert set(done.values()) == {1}


@pytest.mark.timeout(60)
@pytest.mark.gated("g")
def test_grant_passes_to_the_next_waiter_when_the_granted_waiters_worker_was_killed(make_slots: MakeSlots) -> None:
    """grant_ttl 3 s. Waiter "first" was parked by a worker of its own broker queue, which is then
    killed with ``kill -9``; waiter "second" is parked behind it by the survivor. When the holder
    ends, the slot is granted to "first", whose message comes back to a broker queue nobody
    consumes: unconfirmed, the grant passes to "second" after grant_ttl. "first" goes back in
    line and runs once a worker consumes its queue again."""
    conf = {
        "flowcontrol_queues": [{"name": "g", "concurrency": 1, "retry": "30s"}],
        "flowcontrol_grant_ttl": 3,
        "flowcontrol_reclaim_interval": 0.3,
    }
    h = make_slots(conf=conf)
    lonely = f"{h.prefix}.lonely"
    h.start_worker(2, name="survivor")
    victim = h.start_worker(1, name="victim", extra=["-Q", lonely])
    h.send("work", "holder", 4.0, flow_queue="g")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the holder to start")
    first = h.send("work", "first", 0.0, flow_queue="g", queue=lonely)
    wait_for(lambda: h.parked("g") == 1, 20, what="the victim to park the first waiter")
    second_id = h.send("work", "second", 0.0, flow_queue="g")
    wait_for(lambda: h.parked("g") == 2, 20, what="the survivor to park the second waiter")
    assert [w.task_id for w in h.backend().waiters("g")] == [first, second_id]
    h.kill9(victim)
    h.wait_done(["holder"], timeout=20)
    holder_end = max(r.end or 0.0 for r in h.gauge.executions() if r.label == "holder")
    h.wait_done(["second"], timeout=20)
    second = next(r for r in h.gauge.executions() if r.label == "second")
    waited = second.start - holder_end
    assert 2.5 <= waited <= 3.0 + 3.0, f"second waiter ran {waited:.2f} s after the release (grant_ttl 3 s)"
    assert "first" not in h.gauge.runs()
    h.start_worker(1, name="again", extra=["-Q", lonely])
    done = h.wait_done(["first"], timeout=30)
    assert done == {"holder": 1, "first": 1, "second": 1}


def close_gate(h: SlotsHarness) -> None:
    """Make gate tasks wait again (the gauge only opens it)."""
    h.gauge.client.delete(h.gauge.key("gate"))


@pytest.mark.timeout(60)
@pytest.mark.gated("ov")
def test_capacity_override_survives_a_restart_of_every_worker_and_reset_returns_to_config(
    make_slots: MakeSlots,
) -> None:
    """PostgreSQL parking. Configured capacity 1, overridden to 3; every worker stops and a new
    one boots (registering the config again): the override still wins, 3 gate tasks run and 3
    wait. Reset: the configured 1 again, a later batch runs one at a time."""
    h = make_slots(parking="postgres", conf={"flowcontrol_queues": [{"name": "ov", "concurrency": 1}]})
    h.start_worker(2)
    FlowControl(h.app).set_capacity("ov", 3)
    h.stop_all()
    h.start_worker(4, name="after")
    stats = h.backend().stats("ov")
    assert (stats.capacity, stats.concurrency, stats.capacity_override) == (3, 1, 3)
    batch = [f"a{i}" for i in range(6)]
    for label in batch:
        h.send("gate", label, flow_queue="ov")
    wait_for(lambda: h.gauge.started() == 3 and h.parked("ov") == 3, 20, what="3 running and 3 parked")
    h.gauge.open_gate()
    h.wait_done(batch, timeout=20)
    assert h.gauge.peak() == 3

    FlowControl(h.app).set_capacity("ov", None)
    stats = h.backend().stats("ov")
    assert (stats.capacity, stats.capacity_override) == (1, None)
    close_gate(h)
    later = [f"b{i}" for i in range(3)]
    for label in later:
        h.send("gate", label, flow_queue="ov")
    wait_for(lambda: h.gauge.started() == 7 and h.parked("ov") == 2, 20, what="1 running and 2 parked")
    h.gauge.open_gate()
    h.wait_done(later, timeout=20)
    assert max_overlap([r for r in h.gauge.executions() if r.label.startswith("b")]) == 1


@pytest.mark.timeout(60)
@pytest.mark.gated("serial.*")
def test_serial_task_runs_one_at_a_time_across_two_nodes_in_arrival_order(make_slots: MakeSlots) -> None:
    """``serial=True`` with no config: 2 nodes x 2 processes, 16 steps sent 50 ms apart while the
    first runs for 1 s. Never two at once (the gauge's peak), and in the order they arrived."""
    h = make_slots()
    h.start_worker(2)
    h.start_worker(2)
    labels = [f"s{i:02d}" for i in range(16)]
    h.send("serial_step", labels[0], 1.0)
    wait_for(lambda: h.gauge.started() == 1, 20, what="the first step to start")
    for label in labels[1:]:
        h.send("serial_step", label, 0.02)
        time.sleep(0.05)
    h.wait_done(labels, timeout=30)
    runs = h.gauge.executions()
    assert h.gauge.peak() == 1 and max_overlap(runs) == 1
    assert [r.label for r in runs] == labels
    assert len({r.node for r in runs}) == 2, "one node ran every step: the test proves nothing fleet-wide"


@pytest.mark.timeout(90)
@pytest.mark.gated("fg.*")
def test_flow_group_of_500_at_concurrency_10_is_capped_complete_and_in_order(make_slots: MakeSlots) -> None:
    """``flow_group(square.s(), range(500), concurrency=10)`` over 2 nodes x 6 processes (12 > 10):
    never more than 10 members in flight, every result there and in item order, and the group's
    ephemeral flow queue is gone when it ends."""
    from celery_flowcontrol import flow_group

    h = make_slots(results=True)
    h.start_worker(6)
    h.start_worker(6)
    square = h.app.tasks["proj.square"]
    result = flow_group(square.s(seconds=0.01), range(500), concurrency=10)
    values = result.get(timeout=75, interval=0.2)
    assert values == [x * x for x in range(500)]
    assert h.gauge.peak() <= 10, f"{h.gauge.peak()} members ran at once (cap 10)"
    assert max_overlap(h.gauge.executions()) <= 10
    assert h.gauge.peak() >= 5, "the group never ran in parallel"
    assert sum(h.gauge.done().values()) == 500
    wait_for(lambda: not [q for q in h.backend().queues() if q.startswith("fg.")], 10, what="the queue to go")


@pytest.mark.timeout(60)
@pytest.mark.gated("calls")
def test_release_slot_on_the_in_process_backend_returns_within_a_second(make_slots: MakeSlots) -> None:
    """memory:// admission (one worker holds the state): ``release_slot`` from another process goes
    through remote control to that worker, and should return as soon as the worker answered."""
    queue = {"name": "calls", "concurrency": 1, "release": "manual", "max_hold": "60s"}
    h = make_slots(backend="memory", conf={"flowcontrol_queues": [queue]})
    h.start_worker(2)
    h.send("place", "c0", flow_queue="calls")
    wait_for(lambda: "c0" in slot_ids(h), 20, what="the call to take its slot")
    began = time.monotonic()
    released = release_slot(slot_ids(h)["c0"], app=h.app).released
    elapsed = time.monotonic() - began
    assert released is True
    assert elapsed < 1.0, f"release_slot took {elapsed:.2f} s"


@pytest.mark.timeout(60)
def test_acquire_slot_parks_the_task_and_runs_it_again_with_the_granted_slot(make_slots: MakeSlots) -> None:
    """With the only "exports" slot held, ``acquire_slot`` parks its task: it waits in line under
    its label, and no pool process is busy meanwhile. When the holder ends, the task runs again from
    the start, gets the slot, and releases it when it ends."""
    queue = {"name": "exports", "concurrency": 1, "retry": "30s"}
    h = make_slots(results=True, conf={"flowcontrol_queues": [queue]})
    h.start_worker(2)
    h.send("gate", "holder", flow_queue="exports")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the holder to start")
    result = h.app.tasks["proj.acquire"].apply_async(("report-7", "exports", 30.0, 0.1))
    wait_for(lambda: h.parked("exports") == 1, 10, what="the acquiring task to be parked")
    assert [w.label for w in h.backend().waiters("exports")] == ["report-7"]
    assert h.gauge.inflight() == 1 and h.listed("acquire-runs") == ["report-7"]
    h.gauge.open_gate()
    slot = result.get(timeout=20)
    assert slot.startswith("exports:")
    assert h.listed("acquire-runs") == ["report-7", "report-7"], "the task did not run again from the start"
    assert h.gauge.runs() == {"holder": 1, "report-7": 1}
    wait_for(lambda: h.backend().busy_slots("exports") == [], 5, what="the slot to be released at the end")
    assert h.backend().waiters("exports") == []


@pytest.mark.timeout(60)
def test_with_limit_releases_its_slot_when_the_block_raises(make_slots: MakeSlots) -> None:
    """On a manual queue only ``with_limit`` itself can free the slot (the task's end does not): a
    block that raises releases it all the same, and the next task gets it."""
    queue = {"name": "partner", "concurrency": 1, "release": "manual", "max_hold": "60s", "retry": "30s"}
    h = make_slots(results=True, conf={"flowcontrol_queues": [queue]})
    h.start_worker(2)
    failing = h.app.tasks["proj.limited"].apply_async(("s0", "partner", True))
    failing.get(timeout=20, propagate=False)
    assert failing.failed() and isinstance(failing.result, ValueError), repr(failing.result)
    assert h.backend().busy_slots("partner") == []
    ok = h.app.tasks["proj.limited"].apply_async(("s1", "partner", False))
    slot = ok.get(timeout=20)
    assert h.backend().busy_slots("partner") == []
    assert [entry.split("|")[0] for entry in h.listed("limited-slots")] == ["s0", "s1"]
    assert slot.startswith("partner:")


@pytest.mark.timeout(60)
@pytest.mark.gated("calls")
def test_a_manual_slot_outlives_a_kill9_of_the_worker_that_took_it(make_slots: MakeSlots) -> None:
    """instance_ttl 2 s: the placing worker dies (``kill -9``) with the call still going. Its
    manual slot is not freed when its heartbeat lapses (the call is still on at the provider);
    the waiter behind it stays parked until the webhook's release, from a separate process."""
    queue = {"name": "calls", "concurrency": 1, "release": "manual", "max_hold": "60s", "retry": 0.5}
    conf = {"flowcontrol_queues": [queue], "flowcontrol_instance_ttl": 2, "flowcontrol_reclaim_interval": 0.3}
    h = make_slots(conf=conf)
    placer = h.start_worker(1, name="placer")
    h.send("place", "c0", flow_queue="calls")
    wait_for(lambda: "c0" in slot_ids(h), 20, what="the call to take the slot")
    h.kill9(placer)
    h.start_worker(2, name="survivor")
    h.send("place", "c1", flow_queue="calls")
    wait_for(lambda: h.parked("calls") == 1, 20, what="the next call to be parked")
    time.sleep(4.0)  # two instance_ttl: the placer's heartbeat has long lapsed
    assert "c1" not in slot_ids(h)
    assert [s.slot_id for s in h.backend().busy_slots("calls")] == [slot_ids(h)["c0"]]
    assert release_in_subprocess(h, slot_ids(h)["c0"]) is True
    try:
        wait_for(lambda: "c1" in slot_ids(h), 10, what="the waiter to get the released slot")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {queue_state(h, 'calls')}") from None


@pytest.mark.timeout(60)
def test_a_task_parked_by_its_second_acquire_slot_holds_no_slot_of_the_first(make_slots: MakeSlots) -> None:
    """Queues "a" and "b" of capacity 1; "b" is held by a gate task on node w1. A task that acquires
    "a" then "b" runs on node w2 (one process, so each run has finished, and released what it held,
    before the worker reads the next message) and is parked waiting for "b": while it waits it must
    hold no slot of "a" (a parked task holds nothing), so another task acquiring "a" runs at once."""
    queues = [{"name": "a", "concurrency": 1, "retry": "30s"}, {"name": "b", "concurrency": 1, "retry": "30s"}]
    h = make_slots(results=True, conf={"flowcontrol_queues": queues})
    h.start_worker(1, name="w1")
    h.send("gate", "holder", flow_queue="b")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the holder of b to start")
    h.start_worker(1, name="w2")
    nested = h.app.tasks["proj.nested"].apply_async(("both", "a", "b"))
    wait_for(lambda: len(h.backend().waiters("b")) == 1, 20, what="the nested task to wait for b")
    time.sleep(0.5)
    held = [(s.slot_id, s.task_id) for s in h.backend().busy_slots("a")]
    other = h.app.tasks["proj.acquire"].apply_async(("other", "a", 30.0))
    try:
        other.get(timeout=5)
    except Exception as exc:  # noqa: BLE001 - report what held "a"
        raise AssertionError(f"a task acquiring 'a' waited while the other was parked ({exc!r}); a: {held}") from None
    assert held == [], f"the parked task holds a slot of 'a': {held}"
    h.gauge.open_gate()
    assert len(nested.get(timeout=20)) == 2
    idle = lambda: h.backend().busy_slots("a") == [] and h.backend().busy_slots("b") == []  # noqa: E731
    wait_for(idle, 5, what="every slot to be released")


@pytest.mark.timeout(60)
def test_a_revoked_acquire_waiter_leaves_the_line(make_slots: MakeSlots) -> None:
    """Two tasks wait in ``acquire_slot("exports")`` behind a holder; the first is revoked. When the
    holder ends, the second gets the slot at once (not after grant_ttl), the revoked one never runs,
    and no waiter is left."""
    queue = {"name": "exports", "concurrency": 1, "retry": "30s"}
    h = make_slots(results=True, conf={"flowcontrol_queues": [queue], "flowcontrol_grant_ttl": 20})
    h.start_worker(2)
    h.send("gate", "holder", flow_queue="exports")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the holder to start")
    acquire = h.app.tasks["proj.acquire"]
    first = acquire.apply_async(("first", "exports", 30.0))
    wait_for(lambda: len(h.backend().waiters("exports")) == 1, 20, what="the first waiter")
    second = acquire.apply_async(("second", "exports", 30.0))
    wait_for(lambda: len(h.backend().waiters("exports")) == 2, 20, what="the second waiter")
    h.app.control.revoke(first.id)
    time.sleep(0.5)  # the revoke reaches the worker
    h.gauge.open_gate()
    second.get(timeout=8)
    assert "first" not in h.gauge.runs()
    wait_for(lambda: h.backend().waiters("exports") == [], 5, what="no waiter left")
    assert h.parked("exports") == 0


@pytest.mark.timeout(60)
@pytest.mark.gated("calls")
def test_a_max_hold_override_applies_to_slots_granted_after_it(make_slots: MakeSlots) -> None:
    """A manual queue with max_hold 60 s; after the first call took its slot, max_hold is overridden
    to 1 s. The first slot keeps its 60 s; the second call's slot is taken back after 1 s. Releases
    of ids that are not busy slots, or not slot ids at all, return False."""
    queue = {"name": "calls", "concurrency": 2, "release": "manual", "max_hold": "60s"}
    h = make_slots(conf={"flowcontrol_queues": [queue], "flowcontrol_reclaim_interval": 0.3})
    h.start_worker(2)
    h.send("place", "c0", flow_queue="calls")
    wait_for(lambda: "c0" in slot_ids(h), 20, what="the first call")
    FlowControl(h.app).set_max_hold("calls", "1s")
    h.send("place", "c1", flow_queue="calls")
    wait_for(lambda: "c1" in slot_ids(h), 20, what="the second call")
    ids = slot_ids(h)
    wait_for(lambda: len(h.backend().busy_slots("calls")) == 1, 10, what="the second slot to expire")
    assert [s.slot_id for s in h.backend().busy_slots("calls")] == [ids["c0"]]
    assert h.backend().stats("calls").max_hold == 1.0
    assert release_slot(ids["c1"], app=h.app).released is False
    assert release_slot("calls:999999", app=h.app).released is False
    assert release_slot("not a slot id", app=h.app).released is False
    assert release_slot(ids["c0"], app=h.app).released is True
