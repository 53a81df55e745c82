"""The shared fixtures reach real services and keep tests apart from each other."""

from __future__ import annotations

import re

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from sqlalchemy import create_engine, inspect, text


def test_key_prefix_is_unique_and_glob_safe(key_prefix: str) -> None:
    """A prefix is safe inside a SCAN pattern and a Redis hash tag."""
    assert re.fullmatch(r"fct-[0-9a-f]{8}", key_prefix)


def test_redis_set_get_under_prefix(redis_client: redis.Redis, key_prefix: str) -> None:
    """Keys written under the prefix round-trip (and teardown removes them)."""
    redis_client.set(f"{key_prefix}:{{q}}:greeting", "hello")
    assert redis_client.get(f"{key_prefix}:{{q}}:greeting") == b"hello"
    assert list(redis_client.scan_iter(match=f"{key_prefix}*")) == [f"{key_prefix}:{{q}}:greeting".encode()]


@pytest.mark.parametrize("run", ["first", "second"])
def test_postgres_schema_is_private(postgres_url: str, postgres_schema: str, run: str) -> None:
    """Each test gets an empty schema of its own: the same CREATE TABLE works in both runs."""
    engine = create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            assert conn.scalar(text("SELECT current_schema()")) == postgres_schema
            conn.execute(text("CREATE TABLE parked (id int PRIMARY KEY, note text)"))
            conn.execute(text("INSERT INTO parked VALUES (1, :note)"), {"note": run})
            assert conn.scalar(text("SELECT count(*) FROM parked")) == 1
            # The table lives in this schema only, not in public nor in any other test's schema.
            owners = conn.scalars(
                text("SELECT table_schema FROM information_schema.tables WHERE table_name = 'parked'")
            )
            assert list(owners) == [postgres_schema]
        assert inspect(engine).get_table_names() == ["parked"]
        assert "parked" not in inspect(engine).get_table_names(schema="public")
    finally:
        engine.dispose()


def test_sqlite_url_is_a_fresh_file(sqlite_url: str) -> None:
    """The SQLite URL points at a file of this test's own, created on first use."""
    engine = create_engine(sqlite_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x int)"))
        assert inspect(engine).get_table_names() == ["t"]
    finally:
        engine.dispose()


def test_rabbitmq_accepts_a_connection(rabbitmq_url: str) -> None:
    """The broker accepts an AMQP connection and a round trip through a queue."""
    from kombu import Connection

    with Connection(rabbitmq_url, connect_timeout=5) as conn:
        queue = conn.SimpleQueue("fct-fixture-smoke", queue_opts={"auto_delete": True})
        try:
            queue.put({"ping": 1})
            assert queue.get(timeout=5).payload == {"ping": 1}
        finally:
            queue.close()


def test_redis_cluster_spreads_keys(redis_cluster_nodes: list[tuple[str, int]], key_prefix: str) -> None:
    """Keys of different hash tags land on different masters, and each is read back."""
    cluster = RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in redis_cluster_nodes])
    try:
        keys = [f"{key_prefix}:{{q{i}}}:k" for i in range(30)]
        for key in keys:
            cluster.set(key, key)
        assert [cluster.get(key) for key in keys] == [key.encode() for key in keys]
        ports = {cluster.get_node_from_key(key).port for key in keys}
        assert len(ports) == 3
        for key in keys:
            cluster.delete(key)
    finally:
        cluster.close()
