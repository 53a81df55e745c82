"""Calls that collapse at the producer, on real services: a Redis admission backend (the
claims), a Redis broker (what was sent), SQLite and PostgreSQL parking (debounced calls).

Two Celery apps with one key prefix stand for two processes of a fleet; the worker's side
(a key freed when the result lands, a debounced row run) is in tests/e2e/test_collapse.py.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

from celery_flowcontrol import FlowControl, FlowTask
from celery_flowcontrol.collapse.claims import RedisClaims
from celery_flowcontrol.collapse.keys import CollapseError
from celery_flowcontrol.collapse.wiring import claims_of, debounce_rows_of
from celery_flowcontrol.parking import migrate
from celery_flowcontrol.worker.republish import wake_due


def make_app(redis_url: str, key_prefix: str, parking_url: str, *, results: bool = False,
             broker: str | None = None, track_parked: bool = False) -> Celery:
    app = Celery("proj", broker=broker or redis_url, set_as_current=False)
    app.conf.update(
        task_default_queue=f"{key_prefix}.q", task_publish_retry=False,
        result_backend=redis_url if results else None,
        flowcontrol_backend_url=redis_url, flowcontrol_key_prefix=key_prefix,
        flowcontrol_parking_url=parking_url, flowcontrol_track_parked=track_parked,
        flowcontrol_queues=[{"name": "api", "concurrency": 2, "max_hold": "2m"}])
    FlowControl(app)

    @app.task(name="proj.sync", base=FlowTask, flow_unique=True, shared=False)
    def sync(account: int, full: bool = False) -> int:
        return account

    @app.task(name="proj.gated", base=FlowTask, flow_queue="api", shared=False,
              flow_unique=lambda args, kwargs: f"tenant-{kwargs['tenant']}")
    def gated(tenant: str, n: int = 0) -> int:
        return n

    @app.task(name="proj.short", base=FlowTask, flow_unique=True, flow_unique_ttl=0.3,
              shared=False)
    def short(x: int) -> int:
        return x

    @app.task(name="proj.reindex", base=FlowTask, flow_debounce=0.5, flow_debounce_max=2,
              shared=False)
    def reindex(doc: str, version: int) -> int:
        return version

    @app.task(name="proj.per_doc", base=FlowTask, flow_debounce="1s", shared=False,
              debounce_key=lambda args, kwargs: args[0])
    def per_doc(doc: str, version: int) -> int:
        return version

    @app.task(name="proj.bad_key", base=FlowTask, shared=False,
              flow_unique=lambda args, kwargs: kwargs["missing"])
    def bad_key() -> None: ...

    @app.task(name="proj.zero", base=FlowTask, flow_debounce=0, shared=False)
    def zero() -> None: ...

    @app.task(name="proj.both", base=FlowTask, flow_unique=True, flow_debounce="1s",
              shared=False)
    def both(x: int) -> int:
        return x

    @app.task(name="proj.save", base=FlowTask, shared=False)
    def save(doc: str, version: int) -> int:
        return version

    return app


@pytest.fixture
def apps(redis_url: str, key_prefix: str, sqlite_url: str, redis_client: redis.Redis) -> Any:
    """Two producers of one fleet (one key prefix, one broker queue, one parking table)."""
    made = [make_app(redis_url, key_prefix, sqlite_url, results=True) for _ in range(2)]
    yield made
    for app in made:
        app.close()


class Timed:
    """The instants around a burst's calls: each call's own clock reading (the one its due
    time counts from) lies between the time before it and the time after it returned."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []

    def time(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        before = time.time()
        value = call(*args, **kwargs)
        self.spans.append((before, time.time()))
        return value

    def assert_due(self, wake_at: float, *, debounce: float, most: float) -> None:
        """*wake_at* is the trailing edge (*debounce* after the last call), or the burst's cap
        (*most* after its first call) when that comes first."""
        (first_before, first_after), (last_before, last_after) = self.spans[0], self.spans[-1]
        low = min(last_before + debounce, first_before + most)
        high = min(last_after + debounce, first_after + most)
        assert low - 0.001 <= wake_at <= high + 0.001, (low, wake_at, high)


def sent(client: redis.Redis, key_prefix: str) -> int:
    """Messages waiting in the test's broker queue (the Redis transport keeps a list per
    priority step; a flow queue's task gets a broker priority)."""
    q = f"{key_prefix}.q"
    return sum(int(client.llen(name)) for name in (q, *(f"{q}\x06\x16{p}" for p in (3, 6, 9))))


def test_a_second_call_anywhere_in_the_fleet_gets_the_first_calls_id(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    a, b = apps
    first = a.tasks["proj.sync"].delay(7, full=True)
    again = b.tasks["proj.sync"].apply_async((7,), {"full": True})
    other = b.tasks["proj.sync"].delay(8)
    assert again.id == first.id and other.id != first.id
    assert sent(redis_client, key_prefix) == 2  # the duplicate sent nothing
    assert isinstance(claims_of(a), RedisClaims)
    held = {h.collapse_key: h for h in claims_of(b).held("unique")}
    assert held['proj.sync:[[7],{"full":true}]'].task_id == first.id
    assert 3500 < (held['proj.sync:[[7],{"full":true}]'].ttl or 0) <= 3600  # default TTL: 1 h


def test_concurrent_calls_collapse_to_exactly_one(apps: list[Celery], redis_client: redis.Redis,
                                                  key_prefix: str) -> None:
    ids: list[str] = []
    start = threading.Barrier(16)

    def call(i: int) -> None:
        start.wait()
        ids.append(apps[i % 2].tasks["proj.gated"].delay(tenant="acme", n=i).id)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1 and len(ids) == 16
    assert sent(redis_client, key_prefix) == 1
    ttl = next(h.ttl for h in claims_of(apps[0]).held("unique") if h.collapse_key == "proj.gated:tenant-acme")
    assert ttl is not None and 100 < ttl <= 120  # the flow queue's max_hold


def test_the_key_frees_by_its_ttl_and_when_the_first_result_has_landed(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    a, b = apps
    first = a.tasks["proj.short"].delay(1)
    assert b.tasks["proj.short"].delay(1).id == first.id
    time.sleep(0.4)
    assert b.tasks["proj.short"].delay(1).id != first.id  # a crashed holder can't keep it
    held = a.tasks["proj.sync"].delay(3)
    a.backend.store_result(held.id, 3, "SUCCESS")  # its result landed; its release was lost
    assert b.tasks["proj.sync"].delay(3).id != held.id


def test_a_retry_is_the_same_call(apps: list[Celery], redis_client: redis.Redis,
                                  key_prefix: str) -> None:
    a, _ = apps
    first = a.tasks["proj.sync"].delay(9)
    retry = a.tasks["proj.sync"].apply_async((9,), task_id=first.id, retries=1)
    assert retry.id == first.id and sent(redis_client, key_prefix) == 2


def test_bad_input_is_refused_at_publish_and_nothing_is_sent(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    a, _ = apps
    cases = [(lambda: a.tasks["proj.bad_key"].delay(), "proj.bad_key", "flow_unique"),
             (lambda: a.tasks["proj.sync"].delay(object()), "proj.sync", "flow_unique"),
             (lambda: a.tasks["proj.sync"].delay({1: 2}), "proj.sync", "flow_unique"),
             (lambda: a.tasks["proj.zero"].delay(), "proj.zero", "flow_debounce"),
             (lambda: a.tasks["proj.sync"].apply_async((1,), flow_unique=lambda a, k: 5),
              "proj.sync", "flow_unique")]
    for call, task, option in cases:
        with pytest.raises(CollapseError) as info:
            call()
        assert (info.value.task, info.value.option) == (task, option)
        assert task in str(info.value) and option in str(info.value)
    assert sent(redis_client, key_prefix) == 0
    assert claims_of(a).held("unique") == []
    assert debounce_rows_of(a).pending() == []


def test_a_call_that_could_not_be_sent_holds_no_key(redis_url: str, key_prefix: str,
                                                    sqlite_url: str,
                                                    redis_client: redis.Redis) -> None:
    app = make_app(redis_url, key_prefix, sqlite_url, broker="redis://127.0.0.1:1/0")
    app.conf.broker_connection_timeout = 0.5
    with pytest.raises(OperationalError):
        app.tasks["proj.sync"].delay(1)
    assert claims_of(app).held("unique") == []


def test_send_task_returns_the_first_calls_result_and_sends_nothing(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    """With flow control installed in the producer, send_task is wrapped (collapse/sending.py):
    a duplicate by header or by the task's own default gets the first call's id, unsent."""
    import json

    a, b = apps
    first = a.send_task("proj.sync", (5,), headers={"flow_unique": True})
    dup = b.send_task("proj.sync", (5,), headers={"flow_unique": True})
    default = b.send_task("proj.sync", (5,))  # proj.sync is flow_unique=True itself
    assert dup.id == first.id == default.id
    assert claims_of(a).holder("unique", "proj.sync:[[5],{}]") == first.id
    messages = [json.loads(m) for m in redis_client.lrange(f"{key_prefix}.q", 0, -1)]
    assert [(m["headers"]["id"], m["headers"]["task"], m["headers"]["flow_unique_key"])
            for m in messages] == [(first.id, "proj.sync", "proj.sync:[[5],{}]")]
    other = b.send_task("proj.sync", (6,), headers={"flow_unique": True})
    assert other.id != first.id and len(redis_client.lrange(f"{key_prefix}.q", 0, -1)) == 2


def test_send_task_takes_flow_unique_ttl_as_a_header(apps: list[Celery]) -> None:
    a, _ = apps
    first = a.send_task("proj.save", ("doc", 1), headers={"flow_unique": True,
                                                        "flow_unique_ttl": "10m"})
    held = {h.collapse_key: h for h in claims_of(a).held("unique")}
    assert held['proj.save:[["doc",1],{}]'].task_id == first.id
    assert 590 < (held['proj.save:[["doc",1],{}]'].ttl or 0) <= 600


def test_send_task_debounces_by_header_and_by_the_tasks_own_default(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    """Sent by name, a call with the ``flow_debounce`` headers (``flow_debounce_max``,
    ``flow_debounce_key``) joins its burst as ``apply_async(flow_debounce=...)`` would, and
    a debounced task's own default applies by name too; nothing is sent, and the parked row
    carries the burst, not the request headers."""
    a, b = apps
    asked = {"flow_debounce": "0.5s", "flow_debounce_max": "2s", "flow_debounce_key": "doc-1"}
    ids = [(a if i % 2 else b).send_task("proj.save", ("doc-1", i), headers=dict(asked)).id
           for i in range(6)]
    per_call = a.tasks["proj.save"].apply_async(("doc-1", 6), flow_debounce="0.5s",
                                                debounce_key="doc-1")
    by_default = [b.send_task("proj.reindex", ("doc", v)).id for v in range(3)]
    joined = a.tasks["proj.reindex"].delay("doc", 3)
    assert len(set(ids)) == 1 and per_call.id == ids[0]
    assert len(set(by_default)) == 1 and joined.id == by_default[0] != ids[0]
    assert sent(redis_client, key_prefix) == 0
    rows = {r.task_id: r for r in debounce_rows_of(a).pending()}
    assert set(rows) == {ids[0], by_default[0]}
    save, reindex = rows[ids[0]], rows[by_default[0]]
    assert save.headers["argsrepr"] == "('doc-1', 6)" and reindex.headers["argsrepr"] == "('doc', 3)"
    assert save.headers["flow_debounce_burst"]["calls"] == 7
    assert save.headers["flow_debounce_burst"]["key"] == "proj.save:doc-1"
    assert reindex.headers["flow_debounce_burst"]["calls"] == 4
    assert not {"flow_debounce", "flow_debounce_max", "flow_debounce_key"} & set(save.headers)
    # Not debounced by name: another task, or flow_debounce off in the header.
    a.send_task("proj.save", ("doc-1", 7))
    b.send_task("proj.reindex", ("doc", 4), headers={"flow_debounce": False})
    assert sent(redis_client, key_prefix) == 2
    with pytest.raises(CollapseError) as err:
        a.send_task("proj.save", ("doc-1", 8), headers={"flow_debounce": "soon"})
    assert err.value.option == "flow_debounce" and sent(redis_client, key_prefix) == 2


def test_send_task_of_a_producer_without_flow_control_marks_a_duplicate(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    """Celery's own send_task (a producer that never installed flow control: here its
    unwrapped method) publishes anyway; before_task_publish turns the duplicate into
    flowcontrol.collapsed, which runs nothing and names the call that runs."""
    import json

    a, b = apps
    first = Celery.send_task(a, "proj.sync", (5,), headers={"flow_unique": True})
    dup = Celery.send_task(b, "proj.sync", (5,), headers={"flow_unique": True})
    assert dup.id != first.id  # Celery's send_task always returns its own id
    assert claims_of(a).holder("unique", "proj.sync:[[5],{}]") == first.id
    messages = [json.loads(m) for m in redis_client.lrange(f"{key_prefix}.q", 0, -1)]
    marks = {m["headers"]["id"]: (m["headers"]["task"], m["headers"].get("flow_duplicate_of"))
             for m in messages}
    assert marks == {first.id: ("proj.sync", None),
                     dup.id: ("flowcontrol.collapsed", {"task_id": first.id, "task": "proj.sync"})}


@pytest.mark.parametrize("parking", ["sqlite", "postgres"])
def test_a_burst_is_one_parked_row_with_the_last_calls_arguments(
        request: pytest.FixtureRequest, parking: str, redis_url: str, key_prefix: str,
        sqlite_url: str, redis_client: redis.Redis) -> None:
    url = sqlite_url if parking == "sqlite" else request.getfixturevalue("postgres_url")
    if parking == "postgres":
        migrate(url)
    a, b = (make_app(redis_url, key_prefix, url) for _ in range(2))
    calls = Timed()
    ids = [calls.time((a if i % 2 else b).tasks["proj.reindex"].delay, "doc", i).id
           for i in range(20)]
    assert len(set(ids)) == 1 and sent(redis_client, key_prefix) == 0
    rows = debounce_rows_of(a).pending()
    assert [r.task_id for r in rows] == ids[:1]
    row = rows[0]
    assert row.headers["argsrepr"] == "('doc', 19)" and row.headers["flow_debounce_burst"]["calls"] == 20
    calls.assert_due(row.wake_at, debounce=0.5, most=2)
    # The run carries its due instant as its ETA: woken a little ahead, it is held until then.
    from celery_flowcontrol.protocol import parse_eta
    assert parse_eta(row.headers["eta"]) == pytest.approx(row.wake_at, abs=1e-3)
    # Another key, another burst:
    per = {a.tasks["proj.per_doc"].delay(d, 1).id for d in ("x", "y", "x")}
    assert len(per) == 2
    # Due: any waker publishes it, with the burst's id and the last arguments.
    time.sleep(max(0.0, row.wake_at - time.time()) + 0.05)
    assert wake_due(a, debounce_rows_of(a).store) >= 1
    import json
    body = json.loads(redis_client.lrange(f"{key_prefix}.q", 0, -1)[0])
    assert body["headers"]["id"] == ids[0] and body["headers"]["argsrepr"] == "('doc', 19)"
    assert json.loads(__import__("base64").b64decode(body["body"]))[0] == ["doc", 19]
    # The burst has fired: the next call starts a new one.
    assert a.tasks["proj.reindex"].delay("doc", 20).id != ids[0]
    for app in (a, b):
        app.close()


def test_a_tracked_burst_is_parked_in_the_result_backend_its_due_moving_with_it(
        redis_url: str, key_prefix: str, sqlite_url: str, redis_client: redis.Redis) -> None:
    a = make_app(redis_url, key_prefix, sqlite_url, results=True, track_parked=True)
    burst = a.tasks["proj.per_doc"].delay("doc", 1).id
    first = a.AsyncResult(burst).info
    assert a.AsyncResult(burst).state == "PARKED"
    assert (first["queue"], first["reason"]) == ("debounce", "debounce")
    assert first["retry_at"] == debounce_rows_of(a).store.get(burst).wake_at
    time.sleep(0.2)
    assert a.tasks["proj.per_doc"].delay("doc", 2).id == burst  # deferred by a later call
    row = debounce_rows_of(a).store.get(burst)
    assert a.AsyncResult(burst).info["retry_at"] == row.wake_at > first["retry_at"]
    a.close()


@pytest.mark.parametrize("parking", ["sqlite", "postgres"])
def test_flow_debounce_per_call_collapses_a_burst_as_the_decorator_does(
        request: pytest.FixtureRequest, parking: str, redis_url: str, key_prefix: str,
        sqlite_url: str, redis_client: redis.Redis) -> None:
    """``apply_async(..., flow_debounce=..., flow_debounce_max=..., debounce_key=...)`` on a
    task with no collapse option: one parked row per burst key, across two producers, with
    the last call's arguments, published by the waker with the burst's id."""
    import json

    url = sqlite_url if parking == "sqlite" else request.getfixturevalue("postgres_url")
    if parking == "postgres":
        migrate(url)
    a, b = (make_app(redis_url, key_prefix, url) for _ in range(2))
    options = {"flow_debounce": "0.5s", "flow_debounce_max": "2s", "debounce_key": "doc-1"}
    calls = Timed()
    ids = [calls.time((a if i % 2 else b).tasks["proj.save"].apply_async, ("doc-1", i),
                      **options).id for i in range(10)]
    other = a.tasks["proj.save"].apply_async(("doc-2", 0), **{**options, "debounce_key": "doc-2"})
    assert len(set(ids)) == 1 and other.id != ids[0] and sent(redis_client, key_prefix) == 0
    rows = {r.task_id: r for r in debounce_rows_of(a).pending()}
    assert set(rows) == {ids[0], other.id}
    row = rows[ids[0]]
    assert row.headers["argsrepr"] == "('doc-1', 9)" and row.headers["flow_debounce_burst"]["calls"] == 10
    assert row.headers["flow_debounce_burst"]["key"] == "proj.save:doc-1"
    calls.assert_due(row.wake_at, debounce=0.5, most=2)
    # Without the option the same task is sent at once, as before.
    a.tasks["proj.save"].delay("doc-1", 99)
    assert sent(redis_client, key_prefix) == 1
    time.sleep(max(0.0, max(r.wake_at for r in rows.values()) - time.time()) + 0.05)
    assert wake_due(a, debounce_rows_of(a).store) == 2
    bodies = [json.loads(m) for m in redis_client.lrange(f"{key_prefix}.q", 0, -1)]
    published = {m["headers"]["id"]: m["headers"]["argsrepr"] for m in bodies}
    assert published[ids[0]] == "('doc-1', 9)" and published[other.id] == "('doc-2', 0)"
    for app in (a, b):
        app.close()


def test_flow_debounce_per_call_false_sends_a_debounced_task_now_and_bad_values_are_refused(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    a, _ = apps
    burst = a.tasks["proj.reindex"].delay("doc", 1)
    now = a.tasks["proj.reindex"].apply_async(("doc", 2), flow_debounce=False)
    assert now.id != burst.id and sent(redis_client, key_prefix) == 1
    longer = a.tasks["proj.reindex"].apply_async(("doc", 3), flow_debounce="1s")
    assert longer.id == burst.id, "a per-call debounce joins the burst of its key"
    for options, field in (({"flow_debounce": "soon"}, "flow_debounce"),
                           ({"flow_debounce": "2s", "flow_debounce_max": "1s"}, "flow_debounce_max"),
                           ({"flow_debounce": "1s", "debounce_key": 7}, "debounce_key")):
        with pytest.raises(CollapseError) as err:
            a.tasks["proj.save"].apply_async(("doc", 0), **options)
        assert err.value.option == field and err.value.task == "proj.save"
    assert sent(redis_client, key_prefix) == 1
    assert [r.task_id for r in debounce_rows_of(a).pending()] == [burst.id]


def test_a_busy_stream_is_deferred_at_most_flow_debounce_max(
        redis_url: str, key_prefix: str, sqlite_url: str, redis_client: redis.Redis) -> None:
    app = make_app(redis_url, key_prefix, sqlite_url)
    t0 = time.time()
    first = app.tasks["proj.reindex"].delay("doc", 0).id
    while time.time() - t0 < 2.3:
        app.tasks["proj.reindex"].delay("doc", 1)
        time.sleep(0.1)
    rows = debounce_rows_of(app).pending()
    # The burst's first call is stamped once its row is built (a moment after t0).
    assert rows[0].task_id == first and rows[0].wake_at <= t0 + 2 + 0.25
    app.close()


def test_the_cli_and_the_dashboard_show_held_keys_and_pending_debounces(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    import json
    from types import SimpleNamespace

    from click.testing import CliRunner

    from celery_flowcontrol.cli import flowcontrol
    from celery_flowcontrol.dashboard import create_app

    a, b = apps
    held = a.tasks["proj.sync"].delay(11)
    burst = [b.tasks["proj.reindex"].delay("doc", v) for v in range(3)]
    result = CliRunner().invoke(flowcontrol, ["collapsed", "--json"], obj=SimpleNamespace(app=a))
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert [(u["key"], u["task_id"]) for u in shown["unique"]] == [("proj.sync:[[11],{}]", held.id)]
    [pending] = shown["debounce"]
    assert (pending["task_id"], pending["key"], pending["calls"]) == (burst[0].id, "proj.reindex", 3)
    assert pending["args"] == "('doc', 2)"
    text = CliRunner().invoke(flowcontrol, ["collapsed"], obj=SimpleNamespace(app=a)).output
    assert held.id in text and burst[0].id in text and "('doc', 2)" in text
    client = create_app(FlowControl(a), sampler=False, worker_timeout=0.05).test_client()
    page = client.get("/collapsed").get_data(as_text=True)
    assert held.id in page and burst[0].id in page and "(&#39;doc&#39;, 2)" in page
    api = client.get("/api/collapsed").get_json()
    assert api["unique"][0]["task_id"] == held.id and api["debounce"][0]["calls"] == 3


def test_memory_backend_collapses_within_one_process(key_prefix: str, sqlite_url: str) -> None:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_backend_url="memory://", flowcontrol_parking_url=sqlite_url,
                    task_default_queue=f"{key_prefix}.q")
    FlowControl(app)

    @app.task(name="proj.sync", base=FlowTask, flow_unique=True, shared=False)
    def sync(account: int) -> int:
        return account

    first = sync.delay(1)
    assert sync.delay(1).id == first.id and sync.delay(2).id != first.id
    assert claims_of(app).holder("unique", "proj.sync:[[1],{}]") == first.id
    app.close()


def test_concurrent_first_calls_of_a_burst_make_one_row(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    ids: list[str] = []
    start = threading.Barrier(12)

    def call(i: int) -> None:
        start.wait()
        ids.append(apps[i % 2].tasks["proj.reindex"].delay("doc", i).id)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = debounce_rows_of(apps[0]).pending()
    assert len(ids) == 12 and set(ids) == {rows[0].task_id} and len(rows) == 1
    assert rows[0].headers["flow_debounce_burst"]["calls"] == 12
    assert sent(redis_client, key_prefix) == 0


def test_flow_unique_false_per_call_sends_regardless(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    a, _ = apps
    first = a.tasks["proj.sync"].delay(4)
    forced = a.tasks["proj.sync"].apply_async((4,), flow_unique=False)
    by_name = a.send_task("proj.sync", (4,), headers={"flow_unique": False})
    assert len({first.id, forced.id, by_name.id}) == 3 and sent(redis_client, key_prefix) == 3
    assert claims_of(a).holder("unique", "proj.sync:[[4],{}]") == first.id
    # Sent as themselves: the publish hook does not make them duplicates of the first call.
    import json
    tasks = {json.loads(m)["headers"]["id"]: json.loads(m)["headers"]["task"]
             for m in redis_client.lrange(f"{key_prefix}.q", 0, -1)}
    assert tasks == {first.id: "proj.sync", forced.id: "proj.sync", by_name.id: "proj.sync"}


def test_a_debounced_task_that_is_also_unique_claims_no_unique_key(
        apps: list[Celery], redis_client: redis.Redis, key_prefix: str) -> None:
    """A task with both options is debounced, and ``flow_unique`` does not apply to its calls
    (docs/collapse.md): building a burst's row claims no unique key for any call."""
    a, _ = apps
    ids = {a.tasks["proj.both"].delay(i).id for i in range(3)}
    ids.add(a.send_task("proj.both", (3,)).id)
    [row] = debounce_rows_of(a).pending()
    assert ids == {row.task_id} and "flow_unique_key" not in row.headers
    assert claims_of(a).held("unique") == [] and sent(redis_client, key_prefix) == 0


def test_claims_on_a_redis_cluster(redis_cluster_nodes: list[tuple[str, int]], key_prefix: str,
                                   sqlite_url: str) -> None:
    """By URL alone (the admission backend's cluster client): keys in many hash slots."""
    url = "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in redis_cluster_nodes)
    apps = []
    for _ in range(2):
        app = Celery("proj", broker="memory://", set_as_current=False)
        app.conf.update(flowcontrol_backend_url=url, flowcontrol_key_prefix=key_prefix,
                        flowcontrol_parking_url=sqlite_url)
        FlowControl(app)

        @app.task(name="proj.sync", base=FlowTask, flow_unique=True, shared=False)
        def sync(account: int) -> int:
            return account

        apps.append(app)
    a, b = apps
    firsts = [a.tasks["proj.sync"].delay(n) for n in range(20)]
    assert [b.tasks["proj.sync"].delay(n).id for n in range(20)] == [r.id for r in firsts]
    held = {h.collapse_key: h.task_id for h in claims_of(b).held("unique")}
    assert held == {f"proj.sync:[[{n}],{{}}]": r.id for n, r in enumerate(firsts)}
    assert claims_of(a).release("unique", "proj.sync:[[0],{}]", firsts[0].id)
    assert b.tasks["proj.sync"].delay(0).id != firsts[0].id
    for n, r in enumerate(firsts[1:], 1):
        claims_of(a).release("unique", f"proj.sync:[[{n}],{{}}]", r.id)
    for app in apps:
        app.close()
