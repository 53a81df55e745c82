"""Shared fixtures: real services, each test isolated by its own key prefix or schema.

Service          environment variable               default
Redis            FLOWCONTROL_TEST_REDIS_URL         redis://127.0.0.1:6379/0
PostgreSQL       FLOWCONTROL_TEST_POSTGRES_URL      postgresql+psycopg://postgres@127.0.0.1:5432/test
RabbitMQ         FLOWCONTROL_TEST_RABBITMQ_URL      amqp://guest:guest@127.0.0.1:5672//
Redis Cluster    started by the `redis_cluster_nodes` fixture on free loopback ports

A service that does not answer fails the test under CI=true: CI must never go green by
skipping. Elsewhere the fixture tries to start a local server (when its binary is installed)
and otherwise skips, saying what to run (`bash .ci/run` starts everything).

Tests are marked by folder: tests/unit -> `unit`, tests/contract -> `contract`, and so on.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

#: The fixtures of the worker harness (make_harness and its failure report), every tier's.
pytest_plugins = ("tests.support.fixtures",)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}
TEST_FOLDERS = ("unit", "contract", "integration", "e2e")


# -- helpers -------------------------------------------------------------------------------


def in_ci() -> bool:
    """True when the run is CI's (CI=true), where an unreachable service is a failure."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def service_unavailable(service: str, url: str, detail: str) -> NoReturn:
    """Fail (under CI) or skip (elsewhere) a test whose service can't be reached."""
    message = f"{service} is not reachable at {url}: {detail}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing service fails the run; .ci/run starts it)", pytrace=False)
    pytest.skip(f"{message} (run `bash .ci/run`, or set the FLOWCONTROL_TEST_* URL)")


def need_dashboard_module(module: str) -> Any:
    """Import a dashboard dependency (module level); skip without it, but fail under CI
    (.ci/run installs it)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if in_ci():
            raise
        pytest.skip(f"{module} is not installed (pip install 'celery-flowcontrol[dashboard]')",
                    allow_module_level=True)


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``check`` until it returns True or ``timeout`` seconds pass; return the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def inside_one_minute(margin: float = 5.0) -> None:
    """Return once the wall-clock minute has more than *margin* seconds left. A fixed rate
    window of a minute starts on each minute (Redis TIME, this machine's clock): a test that
    reads one twice, or admits twice and expects the second denied, must not straddle a turn."""
    while time.time() % 60 > 60 - margin:
        time.sleep(0.2)


def quick_redis(url: str) -> redis.Redis:
    """A client for probes and SHUTDOWN: redis-py's default retries with backoff would add
    seconds to every check of a server that is down (and to every SHUTDOWN, which drops the link)."""
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2, retry=Retry(NoBackoff(), 0))


def redis_answers(url: str) -> bool:
    """True when a Redis server at ``url`` answers PING."""
    client = quick_redis(url)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def run_quietly(command: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a service command, capturing its output for the error message if it fails."""
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


# -- markers -------------------------------------------------------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test after its folder, so `-m unit` or `-m "not e2e"` select by kind."""
    tests_root = Path(__file__).parent
    for item in items:
        try:
            folder = item.path.relative_to(tests_root).parts[0]
        except ValueError:
            continue
        if folder in TEST_FOLDERS:
            item.add_marker(getattr(pytest.mark, folder))


def pytest_report_header(config: pytest.Config) -> str:
    """Say where the services are expected, and whether a missing one fails or skips."""
    mode = "fail" if in_ci() else "skip"
    return (
        f"flowcontrol services: redis={os.environ.get('FLOWCONTROL_TEST_REDIS_URL', DEFAULT_REDIS_URL)} "
        f"postgres={os.environ.get('FLOWCONTROL_TEST_POSTGRES_URL', DEFAULT_POSTGRES_URL)} "
        f"rabbitmq={os.environ.get('FLOWCONTROL_TEST_RABBITMQ_URL', DEFAULT_RABBITMQ_URL)}; "
        f"unreachable -> {mode}"
    )


# -- per-test names ------------------------------------------------------------------------


@pytest.fixture
def key_prefix() -> str:
    """A prefix unique to this test (``fct-<8 hex>``): letters, digits and one dash only."""
    return f"fct-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A SQLAlchemy URL of a SQLite file in this test's own tmp dir."""
    return f"sqlite:///{tmp_path / 'flowcontrol.sqlite3'}"


# -- Redis ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis server that answers PING (started here outside CI when it must be)."""
    url = os.environ.get("FLOWCONTROL_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    if redis_answers(url):
        yield url
        return
    if in_ci():
        service_unavailable("Redis", url, "PING got no answer")
    parts = urlsplit(url)
    server = shutil.which("redis-server")
    if parts.hostname not in LOOPBACK_HOSTS:
        service_unavailable("Redis", url, "PING got no answer (not a loopback address, so none is started)")
    if server is None:
        service_unavailable("Redis", url, "PING got no answer and there is no redis-server binary to start one")
    port = str(parts.port or 6379)
    result = run_quietly(
        [server, "--daemonize", "yes", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no"]
    )
    if result.returncode != 0 or not wait_until(lambda: redis_answers(url), timeout=10):
        service_unavailable("Redis", url, f"started redis-server but it does not answer: {result.stderr.strip()}")
    yield url
    # We started it, so we stop it: a dev machine gets back what it had.
    client = quick_redis(url)
    try:
        client.shutdown(nosave=True)
    except (redis.RedisError, OSError):
        pass  # SHUTDOWN drops the connection by design.
    finally:
        client.close()


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


# -- Redis Cluster ---------------------------------------------------------------------------


def free_cluster_port() -> int:
    """A loopback port P such that P and its cluster bus port P + 10000 are both free."""
    for _ in range(200):
        port = random.randint(20000, 29999)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free loopback port pair (P, P+10000) for a Redis Cluster node")


def cluster_ok(port: int) -> bool:
    """True when the node on ``port`` reports cluster_state:ok."""
    client = quick_redis(f"redis://127.0.0.1:{port}/0")
    try:
        return b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO")
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def stop_redis(port: int, pidfile: Path) -> None:
    """Shut a Redis server down without saving; kill it by its pid file if it won't listen."""
    client = quick_redis(f"redis://127.0.0.1:{port}/0")
    try:
        client.shutdown(nosave=True)
    except (redis.RedisError, OSError):
        pass
    finally:
        client.close()
    if wait_until(lambda: not pidfile.exists(), timeout=5):
        return
    try:
        os.kill(int(pidfile.read_text().strip()), 9)
    except (OSError, ValueError):
        pass


@pytest.fixture(scope="session")
def redis_cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[tuple[str, int]]]:
    """A fresh 3-master Redis Cluster on free loopback ports; yields ``[(host, port), ...]``.

    The nodes run in a tmp dir, keep nothing on disk and are shut down at the end of the session.
    Connect with ``redis.cluster.RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes])``.
    """
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        service_unavailable("Redis Cluster", "127.0.0.1", "redis-server and redis-cli are needed to start one")
    workdir = tmp_path_factory.mktemp("redis-cluster")
    ports: list[int] = []
    for _ in range(3):
        port = free_cluster_port()
        while port in ports:
            port = free_cluster_port()
        ports.append(port)
    started: list[int] = []
    try:
        for port in ports:
            result = run_quietly([
                server, "--port", str(port), "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                "--save", "", "--appendonly", "no", "--daemonize", "yes", "--dir", str(workdir),
                "--pidfile", str(workdir / f"redis-{port}.pid"), "--logfile", str(workdir / f"redis-{port}.log"),
            ])  # fmt: skip
            if result.returncode != 0:
                pytest.fail(f"redis-server --cluster-enabled on port {port} failed: {result.stderr}", pytrace=False)
            started.append(port)
        for port in ports:
            if not wait_until(partial(redis_answers, f"redis://127.0.0.1:{port}/0"), timeout=10):
                log = (workdir / f"redis-{port}.log").read_text(errors="replace")[-2000:]
                pytest.fail(f"cluster node {port} does not answer PING; log:\n{log}", pytrace=False)
        result = run_quietly(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            timeout=60,
        )  # fmt: skip
        if result.returncode != 0:
            pytest.fail(f"redis-cli --cluster create failed:\n{result.stdout}\n{result.stderr}", pytrace=False)
        # `create` returns once slots are assigned; gossip may still be converging on some nodes.
        if not all(wait_until(partial(cluster_ok, port), timeout=30) for port in ports):
            pytest.fail(f"Redis Cluster on ports {ports} never reached cluster_state:ok", pytrace=False)
        yield [("127.0.0.1", port) for port in ports]
    finally:
        for port in started:
            stop_redis(port, workdir / f"redis-{port}.pid")


# -- PostgreSQL ----------------------------------------------------------------------------


def libpq_url(sqlalchemy_url: str) -> str:
    """The libpq form of a SQLAlchemy PostgreSQL URL (drops the ``+driver`` part)."""
    from sqlalchemy.engine import make_url

    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


def postgres_answers(url: str) -> str | None:
    """None when PostgreSQL at ``url`` accepts a query, else the error text."""
    import psycopg

    try:
        with psycopg.connect(libpq_url(url), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return None
    except psycopg.Error as exc:
        return str(exc).strip() or type(exc).__name__


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """The base PostgreSQL URL (session), checked once; tests use ``postgres_url`` instead."""
    url = os.environ.get("FLOWCONTROL_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
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


def rabbitmq_answers(url: str) -> str | None:
    """None when an AMQP broker at ``url`` accepts a connection, else the error text."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        return None
    except Exception as exc:  # kombu wraps socket and AMQP errors in several classes
        return str(exc).strip() or type(exc).__name__


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """URL of a RabbitMQ broker that accepts a connection (started outside CI when it must be)."""
    url = os.environ.get("FLOWCONTROL_TEST_RABBITMQ_URL", DEFAULT_RABBITMQ_URL)
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
