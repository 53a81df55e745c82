"""``flow_batch`` on real Redis and real SQL (SQLite and PostgreSQL), no worker: each call is a
parked row the moment ``delay`` returns; concurrent batches take each call once, at most
``size`` of one key; the CLI and the dashboard show the batches gathering."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from celery import Celery

from celery_flowcontrol import BatchCall, FlowControl, FlowTask
from celery_flowcontrol.collapse.batching import BATCH_HEADER
from celery_flowcontrol.engines import engines_of
from celery_flowcontrol.parking import migrate
from celery_flowcontrol.parking.batches import BATCH, BatchRows


def make_app(redis_url: str, key_prefix: str, parking_url: str) -> Celery:
    app = Celery("proj", broker=redis_url, set_as_current=False)
    app.conf.update(task_default_queue=f"{key_prefix}.q", task_publish_retry=False,
                    flowcontrol_backend_url=redis_url, flowcontrol_key_prefix=key_prefix,
                    flowcontrol_parking_url=parking_url)
    FlowControl(app)

    @app.task(name="proj.embed", base=FlowTask, shared=False,
              flow_batch={"size": 7, "wait": "1h", "key": lambda args, kwargs: kwargs["model"]})
    def embed(calls: list[BatchCall]) -> list[str]:
        return [c.kwargs["text"] for c in calls]

    return app


@pytest.fixture(params=["sqlite", "postgres"])
def parking_url(request: Any) -> str:
    url = str(request.getfixturevalue(f"{request.param}_url"))
    if request.param == "postgres":
        migrate(url)
    return url


def test_concurrent_batches_take_each_call_once(redis_url: str, key_prefix: str,
                                                parking_url: str,
                                                redis_client: redis.Redis) -> None:
    app = make_app(redis_url, key_prefix, parking_url)
    embed = app.tasks["proj.embed"]
    calls = [embed.delay(text=str(i), model="small" if i % 3 else "large") for i in range(40)]
    store = engines_of(app).store
    assert store.count() >= 40  # every call is a row before delay returns
    batch_rows = [m for m in _all(store) if m.reason == BATCH]
    assert batch_rows and all(BATCH_HEADER in m.headers for m in batch_rows)
    rows = BatchRows(store)
    taken: list[list[str]] = []
    lock = threading.Lock()

    def take(n: int, key: str) -> None:
        got = [m.task_id for m in rows.take(f"b{n}", key, 7)]
        with lock:
            taken.append(got)

    threads = [threading.Thread(target=take, args=(n, f"proj.embed:{'small' if n % 2 else 'large'}"))
               for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [cid for got in taken for cid in got]
    assert sorted(flat) == sorted(r.id for r in calls)  # each call in exactly one batch
    assert all(len(got) <= 7 for got in taken)
    by_id = {r.id: i for i, r in enumerate(calls)}
    for got in taken:
        assert len({by_id[c] % 3 == 0 for c in got}) <= 1  # never two keys in a batch
    app.close()


def _all(store: Any) -> list[Any]:
    from sqlalchemy import select

    from celery_flowcontrol.parking.rows import message_of
    from celery_flowcontrol.parking.statements import PARKED
    return store.db.run(lambda conn: [message_of(r._mapping) for r in conn.execute(select(PARKED))],
                        read_only=True)


def test_the_cli_and_the_dashboard_show_batches_gathering(redis_url: str, key_prefix: str,
                                                           sqlite_url: str) -> None:
    import json
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_flowcontrol.cli import flowcontrol
    from celery_flowcontrol.dashboard import create_app

    app = make_app(redis_url, key_prefix, sqlite_url)
    for i in range(3):
        app.tasks["proj.embed"].delay(text=str(i), model="small")
    result = CliRunner().invoke(flowcontrol, ["collapsed", "--json"], obj=SimpleNamespace(app=app))
    assert result.exit_code == 0, result.output
    [batch] = json.loads(result.output)["batch"]
    assert (batch["key"], batch["calls"]) == ("proj.embed:small", 3) and batch["oldest_age"] < 60
    text = CliRunner().invoke(flowcontrol, ["collapsed"], obj=SimpleNamespace(app=app)).output
    assert "BATCH KEY" in text and "proj.embed:small" in text
    client = create_app(FlowControl(app), sampler=False, worker_timeout=0.05).test_client()
    assert "proj.embed:small" in client.get("/collapsed").get_data(as_text=True)
    assert client.get("/api/collapsed").get_json()["batch"][0]["calls"] == 3
    app.close()


def _batches(store: Any) -> list[Any]:
    return [m for m in _all(store) if m.reason == BATCH]


def _run(task: Any, row: Any) -> list[str]:
    """Run batch *row* here as a worker would once a waker published it (its row gone, its
    id, its header): the calls it took."""
    engines_of(task.app).store.delete(row.task_id)
    task.push_request(id=row.task_id, flow_batch=row.headers[BATCH_HEADER])
    try:
        task()
        return list(task.request.flow_batch)
    finally:
        task.pop_request()


def _parked_at(store: Any, task_id: str) -> float:
    return next(float(m.parked_at) for m in _all(store) if m.task_id == task_id)


def test_a_call_that_joins_a_batch_after_it_took_its_calls_runs_in_the_next(
        redis_url: str, key_prefix: str, parking_url: str, monkeypatch: Any) -> None:
    app = make_app(redis_url, key_prefix, parking_url)
    embed, store = app.tasks["proj.embed"], engines_of(app).store
    first = embed.delay(text="a", model="m")
    [batch] = _batches(store)
    late: list[Any] = []
    take = BatchRows.take

    def a_call_arrives_after_the_take(self: Any, batch_id: str, key: str, size: int) -> Any:
        got = take(self, batch_id, key, size)
        if not late:  # the key is still the running batch's: this call joins it, too late
            late.append(embed.delay(text="late", model="m"))
        return got

    monkeypatch.setattr(BatchRows, "take", a_call_arrives_after_the_take)
    assert _run(embed, batch) == [first.id]
    monkeypatch.undo()
    [following] = _batches(store)  # started by the run for the call it left waiting
    assert following.task_id not in (batch.task_id, late[0].id)
    assert following.headers[BATCH_HEADER]["key"] == "proj.embed:m"
    assert following.wake_at == pytest.approx(_parked_at(store, late[0].id) + 3600, abs=1)
    assert _run(embed, following) == [late[0].id]
    assert store.count() == 0
    app.close()


def test_a_call_that_arrives_as_a_batch_frees_its_key_starts_one_batch(
        redis_url: str, key_prefix: str, parking_url: str, monkeypatch: Any) -> None:
    from celery_flowcontrol.collapse import batchrun

    app = make_app(redis_url, key_prefix, parking_url)
    embed, store = app.tasks["proj.embed"], engines_of(app).store
    first = embed.delay(text="a", model="m")
    [batch] = _batches(store)
    late: list[Any] = []
    claims = batchrun.claims_of(app)
    release = claims.release

    def a_call_arrives_after_the_release(kind: str, key: str, holder: str) -> bool:
        freed = release(kind, key, holder)
        if not late:  # no batch holds the key: this call claims it and starts one
            late.append(embed.delay(text="late", model="m"))
        return freed

    monkeypatch.setattr(claims, "release", a_call_arrives_after_the_release)
    assert _run(embed, batch) == [first.id]
    monkeypatch.undo()
    [following] = _batches(store)  # the call's own, and no second one for the same call
    assert _run(embed, following) == [late[0].id]
    assert store.count() == 0
    app.close()


def test_calls_past_a_batchs_size_run_in_the_next_batch(redis_url: str, key_prefix: str,
                                                       parking_url: str) -> None:
    from celery_flowcontrol.collapse.batching import GRACE
    from celery_flowcontrol.collapse.wiring import claims_of

    app = make_app(redis_url, key_prefix, parking_url)
    embed, store = app.tasks["proj.embed"], engines_of(app).store
    calls = [embed.delay(text=str(i), model="m") for i in range(7)]
    [batch] = _batches(store)  # due now, its key freed for the next call
    # Two calls that read the key's holder before the seventh freed it: they join the full batch.
    over = []
    for i in range(2):
        claims_of(app).claim("batch", "proj.embed:m", batch.task_id, 3600 + GRACE)
        over.append(embed.delay(text=f"over{i}", model="m"))
    assert [b.task_id for b in _batches(store)] == [batch.task_id]
    assert _run(embed, batch) == [r.id for r in calls]
    [following] = _batches(store)
    assert following.wake_at == pytest.approx(_parked_at(store, over[0].id) + 3600, abs=1)
    assert _run(embed, following) == [r.id for r in over]
    assert store.count() == 0
    # Metrics count the two batches and their sizes, from Redis: any scrape sees the fleet.
    from prometheus_client import CollectorRegistry, generate_latest

    from celery_flowcontrol.metrics import FlowControlCollector
    from tests.integration.test_metrics import scrape

    registry = CollectorRegistry()
    registry.register(FlowControlCollector(FlowControl(app)))
    values = scrape(generate_latest(registry).decode())
    task = (("task", "proj.embed"),)
    assert values[("flowcontrol_batches_total", task)] == 2
    assert values[("flowcontrol_batch_size_sum", task)] == 9
    assert [values[("flowcontrol_batch_size_bucket", (("le", le), *task))]
            for le in ("1", "2", "5", "10", "+Inf")] == [0, 1, 1, 2, 2]
    app.close()


def test_flow_batch_false_per_call_is_refused(redis_url: str, key_prefix: str,
                                              sqlite_url: str) -> None:
    from celery_flowcontrol import CollapseError

    app = make_app(redis_url, key_prefix, sqlite_url)
    with pytest.raises(CollapseError, match=r"proj\.embed.*flow_batch|flow_batch.*proj\.embed"):
        app.tasks["proj.embed"].apply_async(kwargs={"text": "a", "model": "m"}, flow_batch=False)
    assert engines_of(app).store.count() == 0
    app.close()


def test_a_producer_that_dies_between_park_and_claim_leaves_no_call_behind(
        redis_url: str, key_prefix: str, sqlite_url: str, monkeypatch: Any) -> None:
    """The call's row is committed, then its producer dies before it claims the key and parks
    the batch: no batch would come. The sweep (waker chores, beat) starts one once the call
    waited ``wait`` and a claim could have lapsed, and never while a batch may still come."""
    import time

    from celery_flowcontrol.collapse import batching
    from celery_flowcontrol.collapse.batching import GRACE, sweep
    from celery_flowcontrol.collapse.wiring import claims_of

    app = make_app(redis_url, key_prefix, sqlite_url)
    embed, store = app.tasks["proj.embed"], engines_of(app).store

    class Died(BaseException):
        pass

    def die(*args: Any) -> None:
        raise Died()

    monkeypatch.setattr(batching, "claims_of", die)  # the producer dies right after the park
    with pytest.raises(Died):
        embed.delay(text="orphan", model="m")
    monkeypatch.undo()
    [orphan] = _all(store)
    assert _batches(store) == [] and claims_of(app).holder("batch", "proj.embed:m") is None
    now = time.time()
    assert sweep(app, now + 3600) == []  # its batch could still come (wait 1 h + GRACE)
    [batch_id] = sweep(app, now + 3600 + GRACE + 1)
    [batch] = _batches(store)
    assert batch.task_id == batch_id and batch.wake_at <= now + 3600 + 1
    assert sweep(app, now + 3600 + GRACE + 1) == []  # the key is held: one batch
    assert _run(embed, batch) == [orphan.task_id]
    assert store.count() == 0
    app.close()


def test_a_full_batch_not_yet_taken_does_not_make_the_next_one_full(
        redis_url: str, key_prefix: str, sqlite_url: str) -> None:
    """Each call counts itself into its batch: the calls a full batch (due now) has not taken
    yet are its own, so the next call starts a batch due at ``wait``, full only at its own
    ``size``; and a worker's look-ahead (``BatchRows.coming``) finds the batch coming due."""
    import time

    app = make_app(redis_url, key_prefix, sqlite_url)
    embed, store = app.tasks["proj.embed"], engines_of(app).store
    now = time.time()
    for i in range(7):
        embed.delay(text=str(i), model="m")
    [full] = _batches(store)
    assert full.wake_at <= time.time()
    embed.delay(text="next", model="m")
    [following] = [b for b in _batches(store) if b.task_id != full.task_id]
    assert following.wake_at >= now + 3600 - 1  # not due: one call of its own
    later = time.time()  # the full batch is due by now: the poll's, not the look-ahead's
    assert BatchRows(store).coming(later, following.wake_at) == [(following.task_id, following.wake_at)]
    assert BatchRows(store).coming(later, now + 60) == []
    for i in range(6):
        embed.delay(text=f"more{i}", model="m")
    assert store.get(following.task_id).wake_at <= time.time()  # its own seventh call: full
    assert len(_run(embed, full)) == 7 and len(_run(embed, following)) == 7
    app.close()


def test_send_task_batches_a_call_and_compressed_calls_run(redis_url: str, key_prefix: str,
                                                           sqlite_url: str) -> None:
    """A call sent by name is parked for a batch as ``apply_async`` parks it: by the known
    task's ``flow_batch``, or by the ``flow_batch`` header where the producer doesn't know
    the task; a call sent with ``compression=`` is read back whole by the batch's run."""
    app = make_app(redis_url, key_prefix, sqlite_url)
    stranger = Celery("other", broker=redis_url, set_as_current=False)
    stranger.conf.update(task_default_queue=f"{key_prefix}.q", task_publish_retry=False,
                         flowcontrol_backend_url=redis_url, flowcontrol_key_prefix=key_prefix,
                         flowcontrol_parking_url=sqlite_url)
    FlowControl(stranger)
    embed, store = app.tasks["proj.embed"], engines_of(app).store
    try:
        first = app.send_task("proj.embed", kwargs={"text": "by name", "model": "s"})
        header = {"flow_batch": {"size": 7, "wait": 3600, "key": "s"}}
        second = stranger.send_task("proj.embed", kwargs={"text": "unknown", "model": "s"},
                                    headers=header)
        zipped = embed.apply_async(kwargs={"text": "z" * 500, "model": "s"}, compression="zlib")
        [batch] = _batches(store)
        calls = [m for m in _all(store) if m.reason != BATCH]
        assert sorted(m.task_id for m in calls) == sorted([first.id, second.id, zipped.id])
        assert all(m.queue == "flowcontrol.batch:proj.embed:s" for m in calls)
        assert _run(embed, batch) == [first.id, second.id, zipped.id]
        assert store.count() == 0
    finally:
        app.close()
        stranger.close()


def test_memory_backend_charges_a_batch_the_sum_of_its_calls_costs(sqlite_url: str,
                                                                   key_prefix: str) -> None:
    """With ``memory://`` the batch's admission is corrected too, by the worker that holds
    the backend (an in-thread worker here: its own process)."""
    from celery.contrib.testing.worker import start_worker

    app = Celery(key_prefix, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(flowcontrol_parking_url=sqlite_url, flowcontrol_poll_interval=0.2,
                    worker_hijack_root_logger=False, flowcontrol_queues=[
                        {"name": "tok", "rate_limit": [{"limit": 1000, "period": 86400,
                                                        "per": "cost"}]}])
    FlowControl(app)

    @app.task(name="proj.costly", base=FlowTask, shared=False, flow_queue="tok", flow_cost=2,
              flow_batch={"size": 3, "wait": 0.3})
    def costly(calls: list[BatchCall]) -> list[int]:
        return [c.args[0] for c in calls]

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        results = [costly.delay(i) for i in range(3)]
        assert [r.get(timeout=20) for r in results] == [0, 1, 2]
    assert FlowControl(app).backend.stats("tok").rates[0].used == 6  # 3 calls x 2, one admission


def test_in_process_claims_let_go_of_a_batch_that_ran_in_another_process(
        sqlite_url: str, key_prefix: str) -> None:
    """``memory://``: the producer's claim on a batch key outlives the batch, which a worker
    (another process) woke and ran; the next call sees its row gone and starts a batch."""
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_parking_url=sqlite_url)
    FlowControl(app)

    @app.task(name="proj.embed", base=FlowTask, shared=False,
              flow_batch={"size": 7, "wait": "1h", "key": lambda args, kwargs: kwargs["model"]})
    def embed(calls: list[BatchCall]) -> list[str]:
        return [c.kwargs["text"] for c in calls]

    store = engines_of(app).store
    embed.delay(text="a", model="m")
    [first] = _batches(store)
    store.delete(first.task_id)  # woken by a worker's waker: published, its row gone
    embed.delay(text="b", model="m")
    [second] = _batches(store)
    assert second.task_id != first.task_id
    app.close()
