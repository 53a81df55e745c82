"""``flow_unique_keep="latest"`` at the producer and in the key store, on real services: the
same steps on the in-process store and on Redis (two apps with one key prefix stand for two
processes of a fleet); the runs on real workers are in tests/e2e/test_latest.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import TaskRevokedError

from celery_flowcontrol import FlowControl, FlowTask
from celery_flowcontrol.collapse.keys import CollapseError
from celery_flowcontrol.collapse.latest import BUSY, REPLACED, RUN, LatestKeys, MemoryLatest, RedisLatest
from celery_flowcontrol.collapse.wiring import latest_of


@pytest.fixture(params=["memory", "redis"])
def keys(request: Any, redis_client: redis.Redis, key_prefix: str) -> LatestKeys:
    return MemoryLatest() if request.param == "memory" else RedisLatest(redis_client, key_prefix)


def test_the_newest_call_runs_alone_and_a_replaced_one_never_runs(keys: LatestKeys) -> None:
    assert keys.claim("k", "a", 60) == (None, None)
    assert keys.start("k", "a", 5, 60) == (RUN, None)
    # b replaces a while a runs: b waits for a's lease, and a's result is discarded.
    assert keys.claim("k", "b", 60) == ("a", "a")
    assert keys.start("k", "b", 5, 60) == (BUSY, "a")
    assert keys.extend("k", "a", 5) and not keys.extend("k", "b", 5)
    assert keys.finish("k", "a") == "b"
    # c replaces b before b ran: b never runs, c does, then c's run is kept.
    assert keys.claim("k", "c", 60) == ("b", None)
    assert keys.start("k", "b", 5, 60) == (REPLACED, "c")
    assert keys.start("k", "c", 5, 60) == (RUN, None)
    [held] = keys.held()
    assert (held.collapse_key, held.latest, held.running, held.done) == ("k", "c", "c", False)
    assert keys.finish("k", "c") is None
    # c's run ended: a later call replaces nothing, and a late copy of b still can't run.
    assert keys.held()[0].done and keys.held()[0].running is None
    assert keys.start("k", "b", 5, 60) == (REPLACED, "c")
    assert keys.claim("k", "d", 60) == (None, None)


def test_a_retry_stays_the_newest_and_a_lapsed_lease_frees_the_key(keys: LatestKeys) -> None:
    keys.claim("r", "a", 60)
    assert keys.start("r", "a", 0.2, 60) == (RUN, None)
    assert keys.finish("r", "a", ending=False) is None  # a retry: a is still the newest
    assert keys.claim("r", "b", 60) == ("a", None)
    assert keys.start("r", "b", 0.2, 60) == (RUN, None)
    keys.claim("r", "c", 60)
    time.sleep(0.3)  # b's node died: its lease was not renewed
    assert keys.start("r", "c", 0.2, 60) == (RUN, None)


def test_a_send_that_fails_gives_the_key_back(keys: LatestKeys) -> None:
    keys.claim("s", "a", 60)
    keys.claim("s", "b", 60)
    assert keys.claim("s", "a", 60, only_if="b") == ("b", None)
    assert keys.start("s", "a", 5, 60) == (RUN, None)
    assert keys.claim("s", "x", 60, only_if="b") == (None, None)  # b is not the newest: no-op
    assert keys.held()[0].latest == "a"


def make_app(redis_url: str, key_prefix: str, parking_url: str) -> Celery:
    app = Celery("proj", broker=redis_url, set_as_current=False)
    app.conf.update(task_default_queue=f"{key_prefix}.q", task_publish_retry=False,
                    result_backend=redis_url, flowcontrol_backend_url=redis_url,
                    flowcontrol_key_prefix=key_prefix, flowcontrol_parking_url=parking_url)
    FlowControl(app)

    @app.task(name="proj.recompute", base=FlowTask, shared=False,
              flow_unique=lambda args, kwargs: args[0], flow_unique_keep="latest")
    def recompute(board: str, version: int) -> int:
        return version

    @app.task(name="proj.sync", base=FlowTask, flow_unique=True, shared=False)
    def sync(account: int) -> int:
        return account

    @app.task(name="proj.nonunique", base=FlowTask, shared=False)
    def plain(x: int) -> int:
        return x

    return app


def test_a_newer_call_anywhere_in_the_fleet_replaces_the_waiting_one(
        redis_url: str, key_prefix: str, sqlite_url: str) -> None:
    a, b = (make_app(redis_url, key_prefix, sqlite_url) for _ in range(2))
    try:
        first = a.tasks["proj.recompute"].delay("board-1", 1)
        second = b.tasks["proj.recompute"].delay("board-1", 2)
        other = b.tasks["proj.recompute"].delay("board-2", 1)
        assert len({first.id, second.id, other.id}) == 3
        assert first.state == "REVOKED" and second.state == "PENDING"
        with pytest.raises(TaskRevokedError) as revoked:
            first.get(timeout=1)
        assert revoked.value.args[1] == {"replaced_by": second.id, "task": "proj.recompute"}
        # Per call on a first-wins task, and by name through send_task.
        third = a.tasks["proj.sync"].apply_async((5,), flow_unique_keep="latest")
        fourth = b.send_task("proj.sync", (5,), headers={"flow_unique_keep": "latest"})
        assert third.id != fourth.id and third.state == "REVOKED"
        assert latest_of(a).held()[0].latest in (second.id, fourth.id)
        assert {h.latest for h in latest_of(b).held()} == {second.id, other.id, fourth.id}
    finally:
        a.close()
        b.close()


def test_bad_keep_is_refused_naming_task_and_option(redis_url: str, key_prefix: str,
                                                    sqlite_url: str) -> None:
    app = make_app(redis_url, key_prefix, sqlite_url)
    try:
        with pytest.raises(CollapseError, match="proj.sync.*flow_unique_keep.*'first' or 'latest'"):
            app.tasks["proj.sync"].apply_async((1,), flow_unique_keep="newest")
        with pytest.raises(CollapseError, match="proj.nonunique.*flow_unique_keep.*needs flow_unique"):
            app.tasks["proj.nonunique"].apply_async((1,), flow_unique_keep="latest")
        cases = (({"flow_unique_keep": "last"}, "'first' or 'latest'"),
                 ({"flow_unique_keep": "latest"}, "needs flow_unique"),
                 ({"flow_unique": True, "flow_unique_keep": "latest", "flow_batch": {"size": 2}},
                  "can't be used with flow_unique"))
        for n, (options, match) in enumerate(cases):
            with pytest.raises(CollapseError, match=f"proj.bad{n}.*flow_.*{match}"):
                @app.task(name=f"proj.bad{n}", base=FlowTask, shared=False, **options)
                def bad(x: int) -> int:
                    return x
                bad.name  # noqa: B018 (bound on first use)
    finally:
        app.close()


def test_memory_backend_on_a_threads_pool_discards_a_replaced_runs_result(
        sqlite_url: str, key_prefix: str) -> None:
    """``memory://``: one process is the fleet. A threads pool can't terminate a run, so the
    replaced run goes on to its end, its result is discarded (REVOKED naming its successor),
    and the newest call starts only after it."""
    from celery.contrib.testing.worker import start_worker

    app = Celery(key_prefix, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(flowcontrol_parking_url=sqlite_url, worker_hijack_root_logger=False,
                    flowcontrol_queues=[{"name": "api", "concurrency": 3}])
    FlowControl(app)
    spans: dict[int, list[float]] = {}
    started = threading.Event()

    @app.task(name="proj.recompute", base=FlowTask, shared=False, flow_queue="api",
              flow_unique=lambda args, kwargs: args[0], flow_unique_keep="latest")
    def recompute(board: str, version: int, hold: float) -> int:
        spans[version] = [time.time()]
        started.set()
        time.sleep(hold)
        spans[version].append(time.time())
        return version

    with start_worker(app, pool="threads", concurrency=3, perform_ping_check=False,
                      shutdown_timeout=10):
        first = recompute.delay("b", 1, 1.0)
        assert started.wait(10)
        second = recompute.delay("b", 2, 0.1)
        assert isinstance(latest_of(app), MemoryLatest)
        assert second.get(timeout=10) == 2
        with pytest.raises(TaskRevokedError) as revoked:
            first.get(timeout=10)
        assert revoked.value.args[1]["replaced_by"] == second.id
        assert len(spans[1]) == 2 and spans[2][0] >= spans[1][1]  # ran to its end, then 2


def test_operators_see_latest_wins_keys(redis_url: str, key_prefix: str, sqlite_url: str) -> None:
    import json
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_flowcontrol.cli import flowcontrol
    from celery_flowcontrol.dashboard import create_app

    app = make_app(redis_url, key_prefix, sqlite_url)
    try:
        app.tasks["proj.recompute"].delay("board-1", 1)
        newest = app.tasks["proj.recompute"].delay("board-1", 2)
        result = CliRunner().invoke(flowcontrol, ["collapsed", "--json"], obj=SimpleNamespace(app=app))
        assert result.exit_code == 0, result.output
        [row] = json.loads(result.output)["latest"]
        assert (row["key"], row["latest"], row["running"], row["done"]) == \
            ("proj.recompute:board-1", newest.id, None, False)
        assert 3500 < row["ttl"] <= 3600
        text = CliRunner().invoke(flowcontrol, ["collapsed"], obj=SimpleNamespace(app=app)).output
        assert "LATEST KEY" in text and newest.id in text
        client = create_app(FlowControl(app), sampler=False, worker_timeout=0.05).test_client()
        assert newest.id in client.get("/collapsed").get_data(as_text=True)
        assert client.get("/api/collapsed").get_json()["latest"][0]["latest"] == newest.id
    finally:
        app.close()


def test_a_run_that_cannot_read_its_key_runs_again_later(sqlite_url: str, key_prefix: str,
                                                         monkeypatch: Any) -> None:
    """An outage of the keys' store as a run starts: the call is neither run unguarded nor
    lost; it is retried (the same call, still the newest) and runs once the store answers."""
    from celery.contrib.testing.worker import start_worker

    app = Celery(key_prefix, broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(flowcontrol_parking_url=sqlite_url, worker_hijack_root_logger=False)
    FlowControl(app)
    runs: list[int] = []

    @app.task(name="proj.recompute", base=FlowTask, shared=False,
              flow_unique=lambda args, kwargs: args[0], flow_unique_keep="latest")
    def recompute(board: str, version: int) -> int:
        runs.append(version)
        return version

    keys = latest_of(app)
    start = keys.start
    failures = [ConnectionError("down")]

    def flaky(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return start(*args)

    monkeypatch.setattr(keys, "start", flaky)
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
        result = recompute.delay("b", 1)
        assert result.get(timeout=20) == 1
    assert runs == [1] and not failures
