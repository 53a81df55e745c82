"""RedisBackend keeps the whole admission contract, on one Redis server and on a Redis Cluster.

The same conformance kit users run (:mod:`celery_flowcontrol.testing`) runs here against a
real server with the kit's fake clock, and against a local 3-master cluster (the scripts
touch only keys of one hash tag, so they run there unchanged).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.testing import CONTRACT_CHECKS, FakeClock, run_admission_backend_contract
from celery_flowcontrol.testing.contract import Check, run_check


@pytest.fixture(scope="module")
def cluster(redis_cluster_nodes: list[tuple[str, int]]) -> Iterator[RedisCluster]:
    client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in redis_cluster_nodes])
    try:
        yield client
    finally:
        client.close()


def _forget(client: redis.Redis | RedisCluster, prefix: str) -> None:
    for key in list(client.scan_iter(match=f"{prefix}:*", count=1000)):
        client.delete(key)


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__)
def test_redis_backend_check(check: Check, redis_client: redis.Redis, key_prefix: str) -> None:
    run_check(check, lambda clock: RedisBackend(redis_client, key_prefix=key_prefix,
                                                clock=clock))


@pytest.mark.parametrize("check", CONTRACT_CHECKS, ids=lambda c: c.__name__)
def test_redis_cluster_check(check: Check, cluster: RedisCluster, key_prefix: str) -> None:
    try:
        run_check(check, lambda clock: RedisBackend(cluster, key_prefix=key_prefix, clock=clock))
    finally:
        _forget(cluster, key_prefix)


def test_the_whole_kit_runs_on_redis(redis_client: redis.Redis) -> None:
    """run_admission_backend_contract, as a user calls it (a fresh prefix per check)."""
    prefixes: list[str] = []

    def make_backend(clock: FakeClock) -> RedisBackend:
        prefixes.append(f"fct-kit-{uuid.uuid4().hex[:8]}")
        return RedisBackend(redis_client, key_prefix=prefixes[-1], clock=clock)

    try:
        assert len(run_admission_backend_contract(make_backend)) == len(CONTRACT_CHECKS)
    finally:
        for prefix in prefixes:
            _forget(redis_client, prefix)


def test_queues_spread_over_cluster_slots(cluster: RedisCluster, key_prefix: str) -> None:
    """Queues live in different hash slots, each queue's keys in one."""
    backend = RedisBackend(cluster, key_prefix=key_prefix)
    try:
        from celery_flowcontrol.config import QueueConfig

        names = [f"q{i}" for i in range(12)]
        for name in names:
            backend.register(QueueConfig(name, concurrency=1))
        slots = {cluster.keyslot(backend.redis_key(n, "cfg")) for n in names}
        assert len(slots) > 1
        for name in names:
            assert cluster.keyslot(backend.redis_key(name, "slots")) == cluster.keyslot(
                backend.redis_key(name, "cfg"))
        backend.heartbeat("i1")  # pipelined across slots
        assert backend.reclaim().total == 0
        assert backend.queues() == sorted(names)
    finally:
        backend.close()
        _forget(cluster, key_prefix)
