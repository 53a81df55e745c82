"""Per-key windows of 100,000 distinct fairness keys on the real Redis:
every per-key key expires, reclaim and lazy expiry delete the ones whose windows are empty,
unregister leaves nothing, and a decision costs about the same with 100,000 keys as with one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from celery_flowcontrol.admission import Ticket
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.testing import FakeClock

KEYS = 100_000
CONFIG = QueueConfig("tenants", per_key_rate_limit=["1/s", {"limit": 5, "period": 2,
                                                             "algorithm": "sliding"}])


@pytest.fixture
def world(redis_client: redis.Redis, key_prefix: str) -> Iterator[tuple[RedisBackend, FakeClock]]:
    clock = FakeClock()
    b = RedisBackend(redis_client, key_prefix=key_prefix, clock=clock)
    b.register(CONFIG)
    yield b, clock
    b.close()


def per_key_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return list(client.scan_iter(match=f"{prefix}:{{tenants}}:k[wl]:*", count=5000))


def admit_batch(b: RedisBackend, start: int, n: int) -> None:
    tickets = [Ticket("tenants", f"t{i}", "i1", fairness_key=f"tenant-{i}")
               for i in range(start, start + n)]
    decisions = b.try_admit_many(tickets)
    assert all(d.admitted for d in decisions)
    # release.lua once per slot, as release() runs it, in one pipeline: one round trip for
    # the batch instead of one per slot. Each reply says the slot was busy (1, or a list
    # when the release granted slots on).
    replies = b.scripts.pipelined("release", [("tenants", (d.slot.slot_id,)) for d in decisions])
    assert all(r == 1 or isinstance(r, list) for r in replies)


def fastest_admit(b: RedisBackend, key: str, n: int = 300) -> float:
    """The fastest of *n* admit+release pairs: a decision that walked the keys would be slow
    in every call, while a busy machine only slows some of them (a mean measures the load)."""
    best = float("inf")
    for i in range(n):
        start = time.perf_counter()
        d = b.try_admit(Ticket("tenants", f"probe-{key}-{i}", "i1", fairness_key=f"{key}-{i % 50}"))
        if d.admitted:
            b.release(d.slot.slot_id)
        best = min(best, time.perf_counter() - start)
    return best


def window_ttls(client: redis.Redis, prefix: str, start: int, n: int) -> list[int]:
    """The TTL (ms) of the window key of each of the fairness keys ``tenant-<start..start+n>``."""
    [one] = client.scan_iter(match=f"{prefix}:{{tenants}}:kw:*:tenant-{start}", count=5000) or [b""]
    stem = one.decode()[: -len(f"tenant-{start}")]
    with client.pipeline(transaction=False) as pipe:
        for i in range(start, start + n):
            pipe.pttl(f"{stem}tenant-{i}")
        return [int(t) for t in pipe.execute()]


def test_100000_keys_expire_and_are_forgotten(world: tuple[RedisBackend, FakeClock],
                                              redis_client: redis.Redis, key_prefix: str) -> None:
    b, clock = world
    fastest_admit(b, "warm", 100)
    few = fastest_admit(b, "few")
    for start in range(0, KEYS, 5000):
        admit_batch(b, start, 5000)
        # Checked batch by batch, as written: on a busy machine the whole write may take
        # longer than the keys live (a minute past their windows, on Redis's own clock).
        ttls = window_ttls(redis_client, key_prefix, start, 5000)
        assert all(0 < t <= 62_100 for t in ttls), \
            f"every key of {start}..{start + 4999} has its window, expiring a minute past it"
    many = fastest_admit(b, "many")
    assert many < 2.5 * few + 0.0005, (few, many)  # flat: no decision walks the keys
    clock.advance(2.5)
    b.reclaim()
    assert per_key_keys(redis_client, key_prefix) == [], "forgotten once empty"
    assert redis_client.zcard(f"{key_prefix}:{{tenants}}:kidx") == 0


def test_a_key_in_use_is_kept_and_unregister_leaves_nothing(
        world: tuple[RedisBackend, FakeClock], redis_client: redis.Redis, key_prefix: str) -> None:
    b, clock = world
    assert b.try_admit(Ticket("tenants", "a", "i1", fairness_key="k")).admitted
    clock.advance(0.5)
    b.reclaim()
    assert not b.try_admit(Ticket("tenants", "b", "i1", fairness_key="k")).admitted
    assert per_key_keys(redis_client, key_prefix)
    b.withdraw("tenants", "b")
    assert b.unregister("tenants", only_if_idle=False)
    assert list(redis_client.scan_iter(match=f"{key_prefix}:*", count=1000)) == []
