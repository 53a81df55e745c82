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
