"""The fixtures every test tier shares (a pytest plugin: tests/conftest.py registers it).

Per test: ``key_prefix`` (``fct-<8 hex>``: every Redis key, broker queue and flowcontrol prefix
of the test is named after it), ``sqlite_url``, ``postgres_schema`` / ``postgres_url`` (a
schema of its own, dropped at teardown), ``redis_client`` (deletes the prefix's keys at
teardown).

The machine's services, checked once a session (:mod:`tests.support.services` says where they
are expected and what a missing one does): ``redis_url``, ``postgres_server_url``,
``rabbitmq_url``. Outside CI a missing local Redis or RabbitMQ is started when its binary is
installed.

Servers of the test's own: ``own_redis`` (a :class:`RedisServer`, free to be flushed, killed
and restarted), ``redis_proxy`` (a :class:`TcpProxy` in front of it), ``redis_cluster_nodes``
(a 3-master Redis Cluster, one a session).

Worker processes: ``make_harness(project, broker=, parking=, conf=, ...)`` builds one test's
world (a :class:`~tests.support.harness.Harness` running one of :mod:`tests.support.projects`)
on the shared services. At teardown every
process is stopped and the test's broker queue and Redis keys are deleted; when the test
failed, the tail of every worker's and beat's log is printed (pytest shows it under
"Captured stdout teardown").
"""

from __future__ import annotations

import fnmatch
import functools
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import redis

from tests.support.harness import Harness
from tests.support.proxies import TcpProxy
from tests.support.services import (
    LOOPBACK_HOSTS,
    RedisServer,
    in_ci,
    libpq_url,
    postgres_answers,
    postgres_url_setting,
    rabbitmq_answers,
    rabbitmq_url_setting,
    redis_answers,
    redis_url_setting,
    run_quietly,
    service_unavailable,
)
from tests.support.topology import Cluster, ReplicatedCluster, SentinelGroup
from tests.support.waiting import wait_until

MakeHarness = Callable[..., Harness]
H = TypeVar("H", bound=Harness)


# -- per-test names ------------------------------------------------------------------------


@pytest.fixture
def key_prefix() -> str:
    """A prefix unique to this test (``fct-<8 hex>``): letters, digits and one dash only."""
    return f"fct-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLAlchemy URL of a SQLite file in this test's own tmp dir."""
    return f"sqlite:///{tmp_path / 'flowcontrol.sqlite3'}"


@pytest.fixture
def store(sqlite_url: str) -> Iterator[Any]:
    """A parking store (``ParkingStore``) on this test's own SQLite file, closed at teardown
    (a module that parks elsewhere defines its own ``store``)."""
    from celery_flowcontrol.parking import ParkingStore

    s = ParkingStore(sqlite_url)
    yield s
    s.close()


# -- Redis ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a Redis server that answers PING (started here outside CI when it must be)."""
    url = redis_url_setting()
    if redis_answers(url):
        yield url
        return
    if in_ci():
        service_unavailable("Redis", url, "PING got no answer")
    parts = urlsplit(url)
    if parts.hostname not in LOOPBACK_HOSTS:
        service_unavailable("Redis", url, "PING got no answer (not a loopback address, so none is started)")
    # We start it, so we stop it: a dev machine gets back what it had.
    server = RedisServer(tmp_path_factory.mktemp("redis"), parts.port or 6379).start()
    yield url
    server.stop()


@pytest.fixture
def redis_client(redis_url: str, key_prefix: str) -> Iterator[redis.Redis]:
    """A ``redis.Redis`` (bytes replies) on ``redis_url``; deletes the test's keys at teardown.

    Every key that contains this test's ``key_prefix`` is removed (found with SCAN, never KEYS),
    so tests that build their keys from ``key_prefix`` never see each other's data.
    """
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"*{key_prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
        client.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A throwaway redis-server of this test's own, free to be flushed, killed and restarted."""
    server = RedisServer(tmp_path / "own-redis").start()
    yield server
    server.stop()


@pytest.fixture
def redis_proxy(own_redis: RedisServer) -> Iterator[TcpProxy]:
    """A :class:`TcpProxy` in front of this test's own Redis server."""
    proxy = TcpProxy(own_redis.port)
    yield proxy
    proxy.close()


@pytest.fixture(scope="session")
def redis_cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[str, int]]]:
    """A fresh 3-master Redis Cluster on free loopback ports; yields ``[(host, port), ...]``.

    Connect with ``redis.cluster.RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes])``.
    """
    cluster = Cluster(tmp_path_factory.mktemp("redis-cluster"))
    try:
        yield cluster.start().nodes
    finally:
        cluster.stop()


@pytest.fixture
def hub() -> Iterator[Any]:
    """A kombu event loop (a worker consumer's ``Hub``), closed at teardown; run it with
    :func:`tests.support.waiting.spin`."""
    from kombu.asynchronous import Hub

    h = Hub()
    yield h
    h.close()


@pytest.fixture
def replicated_cluster(tmp_path: Path) -> Iterator[ReplicatedCluster]:
    """A Redis Cluster of 3 masters and 3 replicas of this test's own. Asked for before
    ``make_harness``, it outlives the harness's teardown: the workers stop while their backend
    still answers, not at the end of a warm shutdown's bound."""
    cluster = ReplicatedCluster(tmp_path / "cluster").start()
    yield cluster
    cluster.stop()


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    """A master, its replica and three Sentinels of this test's own (ask for it before
    ``make_harness``, as for :func:`replicated_cluster`)."""
    group = SentinelGroup(tmp_path / "sentinel").start()
    yield group
    group.stop()


# -- PostgreSQL ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The base PostgreSQL URL (session), checked once; tests use ``postgres_url`` instead."""
    url = postgres_url_setting()
    error = postgres_answers(url)
    if error is not None:
        service_unavailable("PostgreSQL", url, error)
    return url


@pytest.fixture
def postgres_schema(postgres_server_url: str) -> Iterator[str]:
    """A schema of this test's own (``fct_<8 hex>``), dropped with everything in it at teardown."""
    import psycopg
    from psycopg import sql

    schema = f"fct_{uuid.uuid4().hex[:8]}"
    conninfo = libpq_url(postgres_server_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            # A connection the test left idle in a transaction would block DROP forever:
            # wait a little, then end the sessions tagged with this schema's name and retry.
            conn.execute("SET lock_timeout = '5s'")
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            try:
                conn.execute(drop)
            except psycopg.errors.LockNotAvailable:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = %s AND pid <> pg_backend_pid()",
                    (schema,),
                )
                conn.execute(drop)


@pytest.fixture
def postgres_url(postgres_server_url: str, postgres_schema: str) -> str:
    """A SQLAlchemy URL whose connections use this test's own schema (``search_path``).

    The schema name is also the connections' ``application_name`` (and the ``postgres_schema``
    fixture), so teardown can end sessions a test left open.
    """
    from sqlalchemy.engine import make_url

    url = make_url(postgres_server_url).update_query_dict(
        {"options": f"-csearch_path={postgres_schema}", "application_name": postgres_schema}
    )
    return url.render_as_string(hide_password=False)


# -- RabbitMQ ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """URL of a RabbitMQ broker that accepts a connection (started outside CI when it must be)."""
    import shutil

    url = rabbitmq_url_setting()
    error = rabbitmq_answers(url)
    if error is None:
        return url
    if in_ci():
        service_unavailable("RabbitMQ", url, error)
    server = shutil.which("rabbitmq-server")
    if urlsplit(url).hostname not in LOOPBACK_HOSTS or server is None:
        service_unavailable("RabbitMQ", url, error)
    run_quietly([server, "-detached"])
    # RabbitMQ boots an Erlang VM: tens of seconds on a small machine.
    if not wait_until(lambda: rabbitmq_answers(url) is None, timeout=60, interval=1):
        service_unavailable("RabbitMQ", url, "started rabbitmq-server -detached but it does not answer")
    return url


# -- worker processes ----------------------------------------------------------------------


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Keep each phase's report on the item, so teardown knows whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A ``gated`` marker is checked by ``make_harness``'s teardown: on a test without it, the
    marker would promise a check that never runs."""
    for item in items:
        if item.get_closest_marker("gated") and "make_harness" not in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid} is marked gated but makes no harness (make_harness)")


@pytest.fixture
def make_harness(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, key_prefix: str
) -> Iterator[MakeHarness]:
    """A factory of harnesses (usually one per test), each closed at teardown.

    ``make_harness(project=Harness, broker="redis", parking="sqlite", conf=None, flow=True,
    results=False, backend="redis")``: *project* is the :class:`Harness` subclass whose project
    the workers and the client app run (:mod:`tests.support.projects`); *broker* is
    ``"redis"``, ``"rabbitmq"`` (the shared ones) or a broker URL; *results* True keeps
    results in the shared Redis, or names a result backend URL.
    """
    made: list[Harness] = []

    def make(
        project: type[H] = Harness,  # type: ignore[assignment]
        broker: str = "redis",
        parking: str = "sqlite",
        conf: dict[str, Any] | None = None,
        flow: bool = True,
        results: bool | str = False,
        backend: str = "redis",
    ) -> H:
        prefix = key_prefix if not made else f"{key_prefix}{len(made)}"
        broker_url = {"redis": redis_url}.get(broker) or (
            request.getfixturevalue("rabbitmq_url") if broker == "rabbitmq" else broker)
        if parking == "postgres":
            from celery_flowcontrol.parking import migrate

            parking_url = request.getfixturevalue("postgres_url")
            migrate(parking_url)  # what `celery -A proj flowcontrol migrate` does before a deploy
        else:
            parking_url = f"sqlite:///{tmp_path / f'park-{prefix}.sqlite3'}"
        settings: dict[str, Any] = {
            "flowcontrol_backend_url": redis_url if backend == "redis" else "memory://",
            "flowcontrol_parking_url": parking_url,
            "flowcontrol_poll_interval": 0.2,
        }
        settings.update(conf or {})
        harness = project(
            workdir=tmp_path / prefix,
            broker_url=broker_url,
            gauge_url=redis_url,
            prefix=prefix,
            conf=settings,
            flow=flow,
            result_backend=(redis_url if results is True else results or None),
            witness=request.node.get_closest_marker("gated") is not None,
        )
        made.append(harness)
        return harness

    yield make
    failed = any(getattr(getattr(request.node, f"rep_{w}", None), "failed", False) for w in ("setup", "call"))
    for harness in made:
        if failed:
            print(harness.logs())
    # Only a test that ran to its end passed on what it measured (a skip measured nothing).
    passed = getattr(getattr(request.node, "rep_call", None), "passed", False)
    unadmitted = unadmitted_queues(request.node, made) if passed else []
    # Side by side: each close waits for its workers' warm shutdown, one test's worlds at once.
    with ThreadPoolExecutor(max_workers=max(1, len(made))) as pool:
        for closing in [pool.submit(harness.close) for harness in made]:
            closing.result()
    if unadmitted:
        pytest.fail(f"the test is marked gated{tuple(unadmitted)} but no run was admitted in "
                    f"{', '.join(unadmitted)}: what it measured never went through admission", pytrace=False)


def unadmitted_queues(node: pytest.Item, made: list[Harness]) -> list[str]:
    """The flow queues a test's ``@pytest.mark.gated(*queues)`` names (shell patterns, such as
    ``"fg.*"``, met by a run of any of its harnesses) in which no run was admitted; with no
    names, each harness's own ``flowcontrol_queues``, met by a run of that harness. A cap, a
    rate or an order measured on tasks that bypassed admission passes by timing alone."""
    marker = node.get_closest_marker("gated")
    if marker is None:
        return []
    if marker.args:
        seen = {q for h in made for q in admitted_queues(h)}
        return [q for q in marker.args if not fnmatch.filter(seen, q)]
    return [q for h in made for q in configured_queues(h) if q not in admitted_queues(h)]


def admitted_queues(harness: Harness) -> set[str]:
    """The flow queues in which a run of *harness* was admitted."""
    return {q for q, n in harness.gauge.gated().items() if n > 0}


def configured_queues(harness: Harness) -> list[str]:
    """The names of *harness*'s ``flowcontrol_queues``."""
    return [q["name"] if isinstance(q, dict) else str(getattr(q, "name", q))
            for q in harness.conf.get("flowcontrol_queues", [])]


@pytest.fixture
def make_collapse(make_harness: MakeHarness) -> MakeHarness:
    """``make_harness`` running :mod:`tests.support.projects.collapse`, results kept."""
    from tests.support.projects.collapse import CollapseHarness

    return functools.partial(make_harness, CollapseHarness, results=True)


@pytest.fixture
def make_slots(make_harness: MakeHarness) -> MakeHarness:
    """``make_harness`` running :mod:`tests.support.projects.slots`."""
    from tests.support.projects.slots import SlotsHarness

    return functools.partial(make_harness, SlotsHarness)
