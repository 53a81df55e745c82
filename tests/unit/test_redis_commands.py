"""The event loop's admit and release commands, written out at one format each, are byte for
byte the generic encoding of the same script call (admission/redis/wire.py: HotPath.command).

No server is needed: the bytes are compared, nothing is sent.
"""

from __future__ import annotations

import pytest
import redis

from celery_flowcontrol.admission.base import Ticket
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.admission.redis.codec import admit_args

TICKETS = [
    Ticket("q", "t1", "w1@host"),
    Ticket("emails.v2", "9f1c" * 8 + "~r3", "celery@worker-7", -1_000_000, "tenant-42", "order 17"),
    Ticket("q", "é" * 20, "wörker", 1_000_000, "ключ", "ラベル"),
    Ticket("q", "t", "i", 0, "k" * 256, "x" * 256),
]


@pytest.mark.parametrize("clock", [None, lambda: 1_700_000_000.123456], ids=["redis-time", "clock"])
@pytest.mark.parametrize("ticket", TICKETS, ids=["plain", "retry", "unicode", "longest"])
def test_admit_command_is_the_generic_encoding(ticket: Ticket, clock: object) -> None:
    backend = RedisBackend(redis.Redis(), key_prefix="fct", clock=clock)  # type: ignore[arg-type]
    assert backend.scripts.hot is not None
    scripts = backend.scripts
    generic = scripts.hot.command(scripts.by_name["admit"], backend.rkeys.cfg(ticket.queue), scripts.common,
                                  (scripts.now(), *admit_args(ticket)))  # fmt: skip
    assert backend.scripts.admit_command(ticket) == generic


@pytest.mark.parametrize("slot_id", ["q:1", "emails.v2:123456789"])
def test_release_command_is_the_generic_encoding(slot_id: str) -> None:
    backend = RedisBackend(redis.Redis(), key_prefix="fct")
    assert backend.scripts.hot is not None
    queue = slot_id.rpartition(":")[0]
    scripts = backend.scripts
    generic = scripts.hot.command(scripts.by_name["release"], backend.rkeys.cfg(queue), scripts.common,
                                  (scripts.now(), slot_id))  # fmt: skip
    assert backend.scripts.release_command(queue, slot_id) == generic


def test_the_generic_encoding_is_redis_pys() -> None:
    backend = RedisBackend(redis.Redis(), key_prefix="fct")
    assert backend.scripts.hot is not None
    script = backend.scripts.by_name["admit"]
    args = ("", "t", "w1", -5, "ключ", "", 16)
    ours = backend.scripts.hot.command(script, "k", backend.scripts.common, args)
    theirs = redis.Redis().connection_pool.get_encoder()
    packed = b"".join(redis.connection.PythonRespSerializer(512, theirs.encode).pack(
        "EVALSHA", script.sha, 1, "k", *backend.scripts.common, *args))  # fmt: skip
    assert ours == packed
