"""Calls that collapse on real prefork workers, on a Redis and a RabbitMQ broker: a unique call
runs once and its key frees when the result lands; a burst of debounced calls runs once, with
the last call's arguments, after the debounce, and every call's result is that run's."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

from celery_flowcontrol.collapse.wiring import claims_of
from tests.support.harness import wait_for

CONF = {"flowcontrol_queues": [{"name": "api", "concurrency": 2}]}


@pytest.mark.parametrize("broker", ["redis", "rabbitmq"])
def test_unique_and_debounced_calls_collapse_on_real_workers(make_collapse: Any, broker: str) -> None:
    h = make_collapse(broker=broker, conf=CONF)
    # On Redis the worker installs flow control by its consumer step alone (Celery's own way).
    h.start_worker(concurrency=3, env={"FCT_INSTALL": "step"} if broker == "redis" else None)
    app = h.app
    sync, fails, reindex = (app.tasks[f"proj.{n}"] for n in ("sync", "fails", "reindex"))
    claims = claims_of(app)
    stuck = app.tasks["proj.stuck"].delay(1)  # runs 6 s; its key's TTL is 1.5 s

    # Unique: five calls while the first waits or runs are one call.
    calls = [sync.delay(7) for _ in range(5)]
    assert len({r.id for r in calls}) == 1
    assert [r.get(timeout=20) for r in calls] == [7] * 5
    wait_for(lambda: claims.holder("unique", "proj.sync:[[7],{}]") is None, 5,
             what="the key to free once the result landed")
    again = sync.delay(7)
    assert again.id != calls[0].id and again.get(timeout=20) == 7
    assert [r.split("|")[0] for r in h.listed("runs")] == [calls[0].id, again.id]

    # A run stuck past its key's TTL does not keep the key for good.
    wait_for(lambda: claims.holder("unique", "proj.stuck:[[1],{}]") is None, 6,
             what="the key of a stuck run to lapse")
    assert not stuck.ready()

    # An expired call frees its key when the worker revokes it.
    expired = sync.apply_async((6,), expires=datetime.now(timezone.utc) - timedelta(seconds=1))
    assert claims.holder("unique", "proj.sync:[[6],{}]") == expired.id
    wait_for(lambda: claims.holder("unique", "proj.sync:[[6],{}]") is None, 10,
             what="the key of an expired call to free")
    assert expired.state == "REVOKED"

    # A failure frees the key as well (and composes with a flow queue).
    failing = [fails.delay(3), fails.delay(3)]
    assert failing[0].id == failing[1].id
    with pytest.raises(ValueError):
        failing[0].get(timeout=20, propagate=True)
    wait_for(lambda: claims.holder("unique", "proj.fails:acct-3") is None, 5,
             what="the key of a failed call to free")

    # A retry is the same call: it keeps the key while it waits for its countdown.
    flaky = app.tasks["proj.flaky"]
    attempt = flaky.delay(1)
    wait_for(lambda: len(h.listed("attempts")) == 1, 10, what="the first attempt")
    time.sleep(0.3)  # retrying: the next attempt waits out its countdown
    assert claims.holder("unique", "proj.flaky:[[1],{}]") == attempt.id
    assert flaky.delay(1).id == attempt.id
    assert attempt.get(timeout=20) == 1
    assert h.listed("attempts") == [f"{attempt.id}|0", f"{attempt.id}|1"]
    wait_for(lambda: claims.holder("unique", "proj.flaky:[[1],{}]") is None, 5,
             what="the key to free after the retried call landed")

    if broker == "redis":
        # A FlowBackoff parks the call and runs it again: the same call, keeping its key.
        pushed = app.tasks["proj.pushed"]
        call = pushed.delay(1)
        wait_for(lambda: len(h.listed("pushed")) == 1, 10, what="the first run to back off")
        time.sleep(0.3)
        assert claims.holder("unique", "proj.pushed:[[1],{}]") == call.id
        assert pushed.delay(1).id == call.id
        assert call.get(timeout=20) == 2
        assert h.listed("pushed") == [f"{call.id}|1", f"{call.id}|2"]
        wait_for(lambda: claims.holder("unique", "proj.pushed:[[1],{}]") is None, 5,
                 what="the key to free once the call landed")

    # Debounce: a burst of ten runs once, with the last call's arguments, after the last call.
    burst = []
    for version in range(10):
        if version:
            time.sleep(0.05)
        burst.append(reindex.delay("doc-1", version))
    last_call = time.time()  # the last call has returned: its due time was set before this
    assert len({r.id for r in burst}) == 1
    assert [r.get(timeout=20) for r in burst] == [9] * 10
    runs = h.listed("reindexed")
    assert len(runs) == 1
    run_id, version, at = runs[0].split("|")
    assert (run_id, version) == (burst[0].id, "9") and float(at) >= last_call + 1.0 - 0.05
    # Composed with a flow queue and a priority, split by key: one run per tenant, admitted.
    digests = {t: [app.tasks["proj.digest"].delay(t, n) for n in range(4)] for t in ("a", "b")}
    assert {t: len({r.id for r in rs}) for t, rs in digests.items()} == {"a": 1, "b": 1}
    assert [r.get(timeout=20) for t in "ab" for r in digests[t]] == [3] * 8
    done = sorted(r.split("|")[1:3] for r in h.listed("digests"))
    assert done == [["a", "3"], ["b", "3"]]
    assert all(r.split("|")[3].startswith("api:") for r in h.listed("digests"))  # a slot of api

    # Sent by name: the duplicate gets the first call's result (send_task is wrapped) ...
    first = app.send_task("proj.sync", (8,), headers={"flow_unique": True})
    dup = app.send_task("proj.sync", (8,), headers={"flow_unique": True})
    assert dup.id == first.id and first.get(timeout=20) == 8
    # ... and from Celery's own send_task, unwrapped, it is published and runs nothing.
    first = app.send_task("proj.sync", (9,), headers={"flow_unique": True})
    dup = Celery.send_task(app, "proj.sync", (9,), headers={"flow_unique": True})
    assert first.get(timeout=20) == 9
    wait_for(lambda: dup.state == "COLLAPSED", 10, what="the duplicate to be marked")
    assert dup.info == {"task_id": first.id, "task": "proj.sync"}
    assert [sum(r.split("|")[1] == n for r in h.listed("runs")) for n in "89"] == [1, 1]
    assert stuck.get(timeout=20) == 1
    assert h.parked() == 0
