"""A kill -9 of the node running a batch, or of the node forming one, loses no call and puts
none in two batches: the batch acks late, is delivered again to another node, and that run
takes the same calls (their rows were moved into the batch in one transaction) and gives each
call its result; a batch's row a dead waker leased or published is published again."""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_flowcontrol.worker.crashpoints import ENV
from tests.support.harness import wait_for

#: The Redis broker gives a dead node's unacked message back once it is this old. The batch's
#: message is the only one held long (by the doomed node, killed as the batch starts; the spare
#: runs it in 0.1 s), so no live node's message is given back while it runs.
VISIBILITY_TIMEOUT = 8


def test_a_batch_whose_node_is_killed_runs_again_with_the_same_calls(make_collapse: Any) -> None:
    h = make_collapse(broker="redis", conf={
        "broker_transport_options": {"visibility_timeout": VISIBILITY_TIMEOUT}})
    doomed = h.start_worker(concurrency=2, env={"FCT_NODE": "doomed", "FCT_HOLD_SECONDS": "60"})
    task = h.app.tasks["proj.slowbatch"]
    calls = [task.delay(i) for i in range(5)]
    wait_for(lambda: len(h.listed("slowbatches")) == 1, 20, what="the batch to start")
    h.kill9(doomed)
    h.start_worker(concurrency=2, env={"FCT_NODE": "spare", "FCT_HOLD_SECONDS": "0.1"})
    assert [r.get(timeout=60) for r in calls] == list(range(5))
    runs = [line.split("|") for line in h.listed("slowbatches")]
    assert [node for _, node, _ in runs] == ["doomed", "spare"]
    assert runs[0][0] == runs[1][0]  # one batch, run again
    assert sorted(runs[1][2].split(",")) == sorted(r.id for r in calls)
    assert runs[0][2] == runs[1][2]  # the same calls, in no other batch
    wait_for(lambda: h.parked() == 0, 10, what="the batch's rows to go")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("point", ["wake.published", "batch.taken"])
def test_the_node_forming_a_batch_dies(make_collapse: Any, point: str) -> None:
    """The whole node dies as it forms a batch: its waker published the batch's row (not
    deleted: it is published again once its lease lapses, 30 s), or its run took the calls
    (nothing run, the message unacked). Another node runs it: no call lost, each call in one
    batch. (A row leased and not published, ``wake.claimed``, is any parked row's case:
    tests/chaos/test_crashpoints.py.)"""
    h = make_collapse(broker="rabbitmq")
    former = h.start_worker(concurrency=2, name="former", env={ENV: point, "FCT_NODE": "former"})
    task = h.app.tasks["proj.slowbatch"]
    calls = [task.delay(i) for i in range(5)]  # size 5: due at once
    wait_for(lambda: not former.alive(), 40, 0.02, what=f"the node to die at {point}")
    assert former.proc.returncode == -9 and h.listed("slowbatches") == []
    h.start_worker(concurrency=2, name="spare", env={"FCT_NODE": "spare"})
    assert [r.get(timeout=60) for r in calls] == list(range(5))
    wait_for(lambda: h.parked() == 0, 30, what="the batch's rows to go")
    time.sleep(1.0)  # a batch row woken twice would run about now
    batches: dict[str, set[str]] = {}
    for line in h.listed("slowbatches"):
        batch, node, ids = line.split("|")
        assert node == "spare"
        for call in ids.split(","):
            batches.setdefault(call, set()).add(batch)
    assert sorted(batches) == sorted(r.id for r in calls)
    assert all(len(b) == 1 for b in batches.values()), batches  # each call in one batch
    print(f"chaos batch forming at {point}: {len(h.listed('slowbatches'))} run(s) of one batch "
          "on the spare node, every call once", flush=True)
