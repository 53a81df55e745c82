"""A queue's ``keys=`` reaches Redis in chunks (register_keys.lua, ``KEY_CHUNK`` keys a call), so
no call holds Redis long however many keys a config has; and the chunks add up to what one
call did: every key's settings in force, the keys a former config had dropped, ``set_key``
overrides winning until ``reset_key``, a registration superseded by a newer one leaving the
newer one's keys, and an unchanged config written once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_flowcontrol.admission import Ticket
from celery_flowcontrol.admission.redis import RedisBackend, tenant_calls
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.testing import FakeClock

CHUNK = 50


@pytest.fixture
def backend(redis_client: redis.Redis, key_prefix: str,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(tenant_calls, "KEY_CHUNK", CHUNK)
    b = RedisBackend(redis_client, key_prefix=key_prefix, clock=FakeClock())
    calls: list[tuple[str, int]] = []
    run = b.scripts.run

    def counted(name: str, queue: str, *args: object) -> Any:
        if name == "register_keys":
            calls.append((str(args[1]), (len(args) - 2) // 2))  # (last, keys in the call)
        return run(name, queue, *args)

    b.scripts.run = counted  # type: ignore[method-assign]
    b.calls = calls
    yield b
    b.close()


def tiers(n: int, weight: float = 2.0, **extra: Any) -> dict[str, dict[str, Any]]:
    return {f"k{i}": {"weight": weight, "max_waiting": 5, **extra} for i in range(n)}


def own(b: RedisBackend, queue: str) -> dict[str, tuple[float, int | None]]:
    """Every key with settings of its own, as key_stats reads them: weight, max_waiting."""
    return {r.key: (r.weight, r.max_waiting) for r in b.key_stats(queue, limit=10_000)
            if r.overridden}


def test_keys_are_written_in_chunks_and_all_of_them(backend: Any) -> None:
    b = backend
    b.register(QueueConfig("q", concurrency=2, fairness="key", keys=tiers(530)))
    assert len(b.calls) == 11 and all(n <= CHUNK for _, n in b.calls), b.calls
    assert [last for last, _ in b.calls] == [""] * 10 + ["1"], "the last call marks it done"
    assert own(b, "q") == {f"k{i}": (2.0, 5) for i in range(530)}
    assert b.waiting_bounded("q")
    b.calls.clear()
    b.register(QueueConfig("q", concurrency=2, fairness="key", keys=tiers(530)))
    assert b.calls == [], "the same keys= again: nothing to write"


def test_a_new_config_drops_the_keys_it_has_not_and_overrides_still_win(backend: Any) -> None:
    b = backend
    b.register(QueueConfig("q", concurrency=1, fairness="key", keys=tiers(120)))
    b.set_key("q", "k5", weight=7)     # a key the new config keeps
    b.set_key("q", "k100", weight=9)   # and one it drops
    b.calls.clear()
    b.register(QueueConfig("q", concurrency=1, fairness="key", keys=tiers(60, weight=3.0)))
    assert sum(n for _, n in b.calls) == 120, "60 written, 60 dropped"
    expected = {f"k{i}": (3.0, 5) for i in range(60)}
    expected.update({"k5": (7.0, 5), "k100": (9.0, None)})
    assert own(b, "q") == expected
    b.reset_key("q", "k5")
    b.reset_key("q", "k100")
    assert own(b, "q")["k5"] == (3.0, 5) and "k100" not in own(b, "q")
    b.register(QueueConfig("q", concurrency=1, fairness="key"))
    assert own(b, "q") == {} and not b.waiting_bounded("q")


def test_keys_apply_to_decisions_once_written(backend: Any) -> None:
    """A bound of a key past the first chunk refuses, and a grant waits for the last chunk
    no more than the reference's one step does: all of it is in place when register returns."""
    b = backend
    b.register(QueueConfig("q", concurrency=1, fairness="key",
                           keys=tiers(3 * CHUNK, concurrency=1)))
    assert b.try_admit(Ticket("q", "t0", "w", fairness_key=f"k{2 * CHUNK + 1}")).admitted
    for i in range(1, 6):
        assert not b.try_admit(Ticket("q", f"t{i}", "w", fairness_key=f"k{2 * CHUNK + 1}")).admitted
    assert b.would_refuse("q", f"k{2 * CHUNK + 1}") is not None


def test_a_registration_superseded_midway_leaves_the_newer_keys(backend: Any) -> None:
    """Two workers register different configs at once: the chunks of the one that began
    first stop counting once the other began, whose keys stand at the end."""
    b = backend
    old = QueueConfig("q", concurrency=1, fairness="key", keys=tiers(200))
    new = QueueConfig("q", concurrency=1, fairness="key", keys=tiers(80, weight=4.0))
    write = b.write_keys
    interleaved: list[bool] = []

    def write_then_newer(config: QueueConfig, generation: str) -> None:
        if config is old and not interleaved:
            interleaved.append(True)
            b.register(new)  # begins, and finishes, before the old one writes a key
        write(config, generation)

    b.write_keys = write_then_newer  # type: ignore[method-assign]
    b.register(old)
    assert own(b, "q") == {f"k{i}": (4.0, 5) for i in range(80)}
    assert [n for _, n in b.calls] == [CHUNK, 80 - CHUNK, CHUNK], "the old one's first call stopped it"


def test_a_queue_restored_after_its_state_was_lost_gets_its_keys(backend: Any) -> None:
    """restore.lua creates a queue the server forgot (a failover to an empty replica) from an
    instance's config: its keys= follow in chunks, as register's do."""
    b = backend
    config = QueueConfig("q", concurrency=2, fairness="key", keys=tiers(120))
    assert b.restore("i1", config, []) == []
    assert b.queues() == ["q"] and b.get_config("q") == config
    assert own(b, "q") == {f"k{i}": (2.0, 5) for i in range(120)}
    assert [last for last, _ in b.calls] == ["", "", "1"]
