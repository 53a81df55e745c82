"""A kill -9 of the node running a batch loses no call and puts none in two batches: the batch
acks late, is delivered again to another node, and that run takes the same calls (their rows
were moved into the batch in one transaction) and gives each call its result."""

from __future__ import annotations

from typing import Any

from tests.support.harness import wait_for


def test_a_batch_whose_node_is_killed_runs_again_with_the_same_calls(make_collapse: Any) -> None:
    h = make_collapse(broker="redis")
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
