"""``flow_batch`` on real prefork workers (Redis broker): calls parked one by one run together,
at most ``size`` of one key per batch, each call once, each with its own result."""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_flowcontrol import CollapseError
from tests.support.harness import wait_for

CONF = {"flowcontrol_queues": [{"name": "api", "concurrency": 2}]}


@pytest.mark.parametrize("parking", ["sqlite", "postgres"])
def test_batches_form_at_size_and_at_wait_with_a_result_per_call(make_collapse: Any,
                                                                  parking: str) -> None:
    h = make_collapse(broker="redis", parking=parking, conf=CONF)
    h.start_worker(concurrency=3)
    embed, square = h.app.tasks["proj.embed"], h.app.tasks["proj.square"]

    # Twelve calls of two keys: batches of at most 5 calls of one key, each call in one.
    calls = [embed.delay(text=f"t{i}", model="small" if i % 2 else "large") for i in range(12)]
    assert len({r.id for r in calls}) == 12
    assert [r.get(timeout=30) for r in calls] == [f"T{i}" for i in range(12)]
    batches = [line.split("|") for line in h.listed("batches")]
    seen = [cid for _, _, ids in batches for cid in ids.split(",")]
    assert sorted(seen) == sorted(r.id for r in calls)  # every call in exactly one batch
    assert all(len(ids.split(",")) <= 5 and "," not in models for _, models, ids in batches)

    # A lone call forms at wait, not before; no flow queue, a list in call order.
    started = time.time()
    lone = square.delay(7)
    assert lone.get(timeout=20) == 49
    assert time.time() - started >= 0.3

    # An exception as an item fails that call alone.
    mixed = [embed.delay(text=t, model="m") for t in ("a", "bad", "c")]
    assert mixed[0].get(timeout=20) == "A" and mixed[2].get(timeout=20) == "C"
    with pytest.raises(ValueError, match="bad text"):
        mixed[1].get(timeout=20)

    # A return of the wrong shape fails every call with the reason, naming task and option.
    wrong = [embed.delay(text=t, model="w") for t in ("shape", "x")]
    for r in wrong:
        with pytest.raises(CollapseError, match="flow_batch"):
            r.get(timeout=20)
    # Every call's row went with its batch: nothing waits, nothing is left taken.
    wait_for(lambda: h.parked() == 0, 10, what="the batches' rows to go")


def test_bad_flow_batch_is_refused_at_publish(make_collapse: Any) -> None:
    from celery_flowcontrol.collapse.batching import batch_spec

    for bad in ({"size": 0}, {"size": 10_001}, {"wait": 0}, {"size": 2, "key": 3}, {"nope": 1}):
        with pytest.raises(CollapseError, match="flow_batch"):
            batch_spec("proj.t", bad)


def test_flow_batch_with_flow_unique_is_refused_when_the_task_is_made() -> None:
    from celery import Celery

    from celery_flowcontrol import FlowTask

    app = Celery("t", set_as_current=False)
    with pytest.raises(CollapseError, match="'flow_batch'.*flow_unique"):
        @app.task(name="t.both", shared=False, base=FlowTask, flow_unique=True, flow_batch={"size": 2})
        def both(calls: Any) -> None: ...
        app.finalize()
        app.tasks["t.both"]
    with pytest.raises(CollapseError, match="size must be"):
        @app.task(name="t.big", shared=False, base=FlowTask, flow_batch={"size": 10_001})
        def big(calls: Any) -> None: ...
        app.tasks["t.big"]


@pytest.mark.gated("api")
def test_a_batch_is_one_admission_costing_the_sum_of_its_calls(make_collapse: Any) -> None:
    from celery_flowcontrol import FlowControl

    conf = {"flowcontrol_queues": [{"name": "api", "concurrency": 2,
                                    "rate_limit": {"limit": 1000, "period": "1h", "per": "cost"}}]}
    h = make_collapse(broker="redis", conf=conf)
    h.start_worker(concurrency=2)
    embed = h.app.tasks["proj.embed"]
    calls = [embed.apply_async(kwargs={"text": f"t{i}", "model": "c"}, flow_cost=2)
             for i in range(5)]
    assert [r.get(timeout=30) for r in calls] == [f"T{i}" for i in range(5)]
    assert len(h.listed("batches")) == 1
    stats = FlowControl(h.app).backend.stats("api")
    wait_for(lambda: FlowControl(h.app).backend.stats("api").rate_used == 10, 5,
             what=f"one admission costing 5 x 2 (used {stats.rate_used})")


@pytest.mark.parametrize("parking", ["sqlite", "postgres"])
def test_calls_past_a_batchs_size_run_in_the_next_batch(make_collapse: Any, parking: str) -> None:
    from celery_flowcontrol.collapse.batching import GRACE
    from celery_flowcontrol.collapse.wiring import claims_of
    from celery_flowcontrol.engines import engines_of
    from celery_flowcontrol.parking.batches import BATCH

    h = make_collapse(broker="redis", parking=parking, conf=CONF)
    embed, store = h.app.tasks["proj.embed"], engines_of(h.app).store
    calls = [embed.delay(text=f"t{i}", model="o") for i in range(5)]
    [batch] = [m.task_id for m in store.list("api") if m.reason == BATCH]
    # Two calls that read the key's holder before the fifth freed it join the full batch; the
    # batch's run starts the next one for them (a row of the worker's making, run by a worker).
    for i in range(5, 7):
        claims_of(h.app).claim("batch", "proj.embed:o", batch, 60 + GRACE)
        calls.append(embed.delay(text=f"t{i}", model="o"))
    assert [m.task_id for m in store.list("api") if m.reason == BATCH] == [batch]
    h.start_worker(concurrency=2)
    assert [r.get(timeout=30) for r in calls] == [f"T{i}" for i in range(7)]
    ids = [line.split("|")[2].split(",") for line in h.listed("batches")]
    assert sorted(ids) == sorted([[r.id for r in calls[:5]], [r.id for r in calls[5:]]])
    wait_for(lambda: h.parked() == 0, 10, what="the batches' rows to go")
