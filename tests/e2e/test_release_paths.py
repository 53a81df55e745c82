"""A slot is released exactly once whichever way its task finishes: success, failure, retry
(admitted again as a new ticket), reject, ignore, revoke with terminate, hard time limit,
and a pool child lost mid-task. Real prefork worker, Redis broker, Redis backend."""

from __future__ import annotations

import time

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import wait_for
from tests.support.projects.fates import QUEUE as FATES
from tests.support.projects.fates import FatesHarness, stats

QUEUE = {"name": FATES, "concurrency": 1}


def finish(h: FatesHarness, label: str, how: str, **options: object) -> str:
    """Send one fate and wait until it has started."""
    task_id = h.send("fate", label, how, **options)
    wait_for(lambda: label in h.gauge.runs(), 20, what=f"{label} to start")
    return task_id


def idle(h: FatesHarness) -> bool:
    s = stats(h, FATES)
    return s.in_use == 0 and s.granted == 0 and s.waiting == 0


@pytest.mark.gated(FATES)
@pytest.mark.timeout(150)
def test_every_finish_path_releases_the_slot_once(make_harness: MakeHarness) -> None:
    h = make_harness(FatesHarness, conf={"flowcontrol_queues": [QUEUE]})
    h.start_worker(2)

    for how in ("ok", "fail", "retry", "reject", "ignore"):
        finish(h, how, how)
        # A follow-up can only run once the slot came back (the cap is 1).
        h.send("fate", f"after-{how}", "ok")
        h.wait_done([f"after-{how}"], 20)
        wait_for(lambda: idle(h), 10, what=f"the slot back after {how}")
    assert h.gauge.runs()["retry"] == 2, "the retry ran again, through admission"
    # Killed tasks below never record their end, so the task-measured peak is read here.
    assert h.gauge.peak() == 1, "the cap held through every path"

    task_id = finish(h, "terminated", "sleep")
    h.app.control.revoke(task_id, terminate=True)
    h.send("fate", "after-terminate", "ok")
    h.wait_done(["after-terminate"], 20)

    finish(h, "timed-out", "sleep", time_limit=1)
    h.send("fate", "after-time-limit", "ok")
    h.wait_done(["after-time-limit"], 25)

    finish(h, "lost", "exit")
    h.send("fate", "after-lost", "ok")
    h.wait_done(["after-lost", "lost"], 40)  # the lost task is redelivered and completes

    wait_for(lambda: idle(h), 10, what="every slot back")
    time.sleep(0.5)
    assert idle(h)


@pytest.mark.gated(FATES)
@pytest.mark.timeout(90)
def test_a_published_retry_waits_for_the_run_that_published_it(make_harness: MakeHarness) -> None:
    """``self.retry`` publishes the next attempt from inside the run, and the run goes on
    until it returns (here: until the test opens the gate). The slot stays with that run: the
    retry (a new ticket) and a follow-up both wait in line while the pool has a free process,
    and run once the run has ended."""
    h = make_harness(FatesHarness, conf={"flowcontrol_queues": [QUEUE]})
    h.start_worker(2)

    finish(h, "held", "retry-held")
    h.send("fate", "after-held", "ok")
    wait_for(lambda: stats(h, FATES).waiting == 2, 20, what="the retry and the follow-up in line")
    assert stats(h, FATES).in_use == 1
    assert h.gauge.runs() == {"held": 1}, "nothing ran beside the run that holds the slot"

    h.gauge.open_gate()
    h.wait_done(["after-held"], 20)
    wait_for(lambda: h.gauge.done().get("held") == 2, 20, what="the retry's second run")
    wait_for(lambda: idle(h), 10, what="the slot back")
    assert h.gauge.peak() == 1, "the cap held while the retry was published"
