"""What only the Redis backend can get wrong: the boundary, pub/sub, keys, outages, clocks.

- Bad or odd input gets a clear error or the documented answer, never a Lua error string.
- A grant reaches a subscriber in another process, and a listener survives a killed
  connection.
- Every key stays under the prefix, with one hash tag per queue.
- An unreachable server raises BackendUnavailableError; scripts the server forgot reload.
- Without a clock, every decision reads Redis TIME.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from celery_flowcontrol.admission import Admitted, Denied, Ticket
from celery_flowcontrol.admission.base import Grant
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.admission.redis.codec import RATE_EPOCH_MS, RATE_KEEP_MS
from celery_flowcontrol.admission.release_rate import ReleaseRate
from celery_flowcontrol.config import QueueConfig, RateLimit
from celery_flowcontrol.errors import (
    BackendUnavailableError,
    FlowControlConfigError,
    FlowControlError,
    InvalidTicketError,
    MissingDependencyError,
    UnknownQueueError,
)
from celery_flowcontrol.testing import FakeClock
from celery_flowcontrol.testing.support import expect_admitted
from tests.support.services import RedisServer
from tests.support.waiting import inside_one_minute


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def backend(redis_client: redis.Redis, key_prefix: str, clock: FakeClock) -> Iterator[RedisBackend]:
    b = RedisBackend(redis_client, key_prefix=key_prefix, clock=clock)
    yield b
    b.close()


def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# -- the boundary --------------------------------------------------------------------------

ODD_TEXT = ["", "é" * 128, "🚀🚀", "a\x00b", "{x}", "}{", "a:b:c", "\n\t", "-1", "1e9",
            "nil", "false", "*", "k" * 256]


@pytest.mark.parametrize("text", ODD_TEXT, ids=lambda t: repr(t)[:12])
def test_odd_strings_round_trip_exactly(backend: RedisBackend, text: str) -> None:
    """Keys and labels of any shape are data, not syntax: they come back byte for byte."""
    backend.register(QueueConfig("q", concurrency=1, fairness="key", per_key_concurrency=1))
    task = f"t-{text[:60]}"  # task ids and instances are at most 255 bytes
    slot = backend.try_admit(Ticket("q", task, f"i-{text[:60]}", 0, text, text))
    assert isinstance(slot, Admitted)
    assert (slot.slot.task_id, slot.slot.holder, slot.slot.fairness_key, slot.slot.label) == (
        task, f"i-{text[:60]}", text, text)
    denied = backend.try_admit(Ticket("q", "other", "i", 1_000_000, text, text))
    assert isinstance(denied, Denied)
    [w] = backend.waiters("q")
    assert (w.task_id, w.fairness_key, w.label, w.priority) == ("other", text, text, 1_000_000)
    assert backend.busy_slots("q")[0] == slot.slot
    assert backend.release(slot.slot.slot_id) is True
    assert [g.task_id for g in backend.pending_grants("q")] == ["other"]
    assert backend.withdraw("q", "other") is True


@pytest.mark.parametrize("priority", [-1_000_000, -1, 0, 999_999, 1_000_000])
def test_priority_extremes_order_exactly(backend: RedisBackend, priority: int) -> None:
    backend.register(QueueConfig("q", concurrency=1))
    backend.try_admit(Ticket("q", "busy", "i"))
    for task, p in (("mid", 0), ("edge", priority), ("low", -1_000_000)):
        backend.try_admit(Ticket("q", task, "i", p))
    order = [w.task_id for w in backend.waiters("q")]
    expected = sorted([("mid", 0), ("edge", priority), ("low", -1_000_000)],
                      key=lambda tp: -tp[1])  # stable: arrival order among equals
    assert order == [t for t, _ in expected]


def test_bad_input_never_reaches_lua(backend: RedisBackend) -> None:
    """Every bad call is a FlowControlError or a documented False, never a redis error."""
    backend.register(QueueConfig("q", concurrency=1))
    calls: list[tuple[Callable[[], Any], Any]] = [
        (lambda: backend.try_admit(Ticket("nope", "t", "i")), UnknownQueueError),
        (lambda: backend.try_admit(Ticket("Q{x}", "t", "i")), UnknownQueueError),
        (lambda: backend.try_admit(Ticket("q", "t\ud800", "i")), InvalidTicketError),
        (lambda: backend.try_admit(Ticket("q", "t", "i", 0, "k\udfff")), InvalidTicketError),
        (lambda: Ticket("q", "t", "i", "1"), InvalidTicketError),  # type: ignore[arg-type]
        (lambda: Ticket("q", "t", "i", 0, "k" * 257), InvalidTicketError),
        (lambda: backend.stats("nope"), UnknownQueueError),
        (lambda: backend.stats("a}b"), UnknownQueueError),
        (lambda: backend.waiters("nope"), UnknownQueueError),
        (lambda: backend.busy_slots("nope"), UnknownQueueError),
        (lambda: backend.get_config("nope"), UnknownQueueError),
        (lambda: backend.withdraw("nope", "t"), UnknownQueueError),
        (lambda: backend.pending_grants("nope"), UnknownQueueError),
        (lambda: backend.set_capacity("nope", 3), UnknownQueueError),
        (lambda: backend.set_capacity("nope", -3), UnknownQueueError),
        (lambda: backend.set_capacity("q", -3), FlowControlConfigError),
        (lambda: backend.set_capacity("q", 2.5), FlowControlConfigError),  # type: ignore[arg-type]
        (lambda: backend.set_max_hold("q", "forever"), FlowControlConfigError),
        (lambda: backend.set_max_hold("nope", 10), UnknownQueueError),
    ]
    for call, error in calls:
        with pytest.raises(error) as info:
            call()
        assert not isinstance(info.value, redis.RedisError)
        assert "ERR" not in str(info.value) and "script" not in str(info.value).lower()
    for slot_id in ("q:999", "q:", ":1", "q:1:x", "q:٣", "nope:1", "Q:1", "", "q:-1",
                    None, 7, b"q:1"):
        assert backend.release(slot_id) is False  # type: ignore[arg-type]
    assert backend.withdraw("q", "never-waited") is False
    assert backend.unregister("nope") is False and backend.unregister("A B") is False
    assert backend.waiters("q", limit=0) == [] and backend.waiters("q", limit=-5) == []


def test_missing_redis_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(MissingDependencyError) as info:
        RedisBackend.from_url("redis://127.0.0.1:6379/0")
    assert info.value.extra == "redis" and "celery-flowcontrol[redis]" in str(info.value)


@pytest.mark.parametrize("prefix", ["", "a{b", "x}", "has space", "p" * 65])
def test_bad_key_prefix_is_a_config_error(redis_client: redis.Redis, prefix: str) -> None:
    with pytest.raises(FlowControlConfigError) as info:
        RedisBackend(redis_client, key_prefix=prefix)
    assert info.value.field == "flowcontrol_key_prefix"


# -- pub/sub -------------------------------------------------------------------------------

LISTENER = textwrap.dedent("""
    import json, sys, time
    from celery_flowcontrol.admission.redis import RedisBackend
    backend = RedisBackend.from_url(sys.argv[1], key_prefix=sys.argv[2])
    def heard(grant):
        print(json.dumps([grant.queue, grant.task_id, grant.slot_id, grant.granted_at,
                          grant.expires_at]), flush=True)
    backend.subscribe_grants(heard)
    print("ready", flush=True)
    time.sleep(30)
""")


def test_a_grant_reaches_a_subscriber_in_another_process(backend: RedisBackend, redis_url: str,
                                                         key_prefix: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", LISTENER, redis_url, key_prefix],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        backend.register(QueueConfig("q", concurrency=1))
        slot = backend.try_admit(Ticket("q", "first", "i"))
        assert isinstance(slot, Admitted)
        backend.try_admit(Ticket("q", "next", "i"))
        backend.release(slot.slot.slot_id)
        [grant] = backend.pending_grants("q")
        line = proc.stdout.readline()
        assert Grant(*json.loads(line)) == grant  # exact floats, across processes
    finally:
        proc.kill()
        proc.wait()


def _kill_pubsub_connections(client: redis.Redis, name: str) -> int:
    killed = 0
    for info in client.client_list():
        if info.get("name") == name and int(info.get("sub", 0)) > 0:
            client.client_kill_filter(_id=info["id"])
            killed += 1
    return killed


def test_a_listener_reconnects_after_its_connection_is_killed(redis_url: str,
                                                              key_prefix: str,
                                                              redis_client: redis.Redis) -> None:
    name = f"fct-listener-{uuid.uuid4().hex[:8]}"
    backend = RedisBackend.from_url(redis_url, key_prefix=key_prefix, client_name=name)
    heard: list[Grant] = []
    sub = backend.subscribe_grants(heard.append)
    try:
        backend.register(QueueConfig("q", concurrency=1))

        def grant_one(tag: str) -> None:
            slot = backend.try_admit(Ticket("q", f"holder-{tag}", "i"))
            assert isinstance(slot, Admitted)
            backend.try_admit(Ticket("q", tag, "i"))
            backend.release(slot.slot.slot_id)
            backend.try_admit(Ticket("q", tag, "i"))  # confirm, so the next round is alike
            backend.release(backend.busy_slots("q")[0].slot_id)

        grant_one("before")
        assert wait_for(lambda: [g.task_id for g in heard] == ["before"])
        assert _kill_pubsub_connections(redis_client, name) == 1
        # The listener notices, waits a moment and subscribes again; grants made meanwhile
        # may be missed (pending_grants covers them), so keep granting until one arrives.
        deadline = time.monotonic() + 10
        round_ = 0
        while time.monotonic() < deadline and not any(g.task_id.startswith("after")
                                                       for g in heard):
            round_ += 1
            grant_one(f"after{round_}")
            time.sleep(0.1)
        assert any(g.task_id.startswith("after") for g in heard), heard
    finally:
        sub.close()
        backend.close()


def test_two_backends_share_grants(backend: RedisBackend, redis_url: str,
                                   key_prefix: str) -> None:
    other = RedisBackend.from_url(redis_url, key_prefix=key_prefix)
    heard: list[Grant] = []
    sub = other.subscribe_grants(heard.append)
    try:
        backend.register(QueueConfig("q", concurrency=1))
        slot = backend.try_admit(Ticket("q", "a", "i1"))
        assert isinstance(other.try_admit(Ticket("q", "b", "i2")), Denied)
        assert isinstance(slot, Admitted)
        assert other.release(slot.slot.slot_id) is True
        assert wait_for(lambda: [g.task_id for g in heard] == ["b"])
        sub.close()
        sub.close()  # idempotent
    finally:
        other.close()


def test_a_release_hands_its_grant_to_its_own_listeners_at_once_and_once(
        backend: RedisBackend, redis_url: str, key_prefix: str) -> None:
    """The releasing process's listeners get the grant on the releasing thread, before
    release() returns (no wait for the listener thread); the pub/sub copy is dropped, so each
    grant is heard once. Another process's listener still hears it through pub/sub.

    Whichever copy comes first is delivered: so that the pub/sub copy can't win the race on a
    busy machine, the listener thread is kept busy with another grant meanwhile."""
    other = RedisBackend.from_url(redis_url, key_prefix=key_prefix)
    here: list[tuple[str, str]] = []
    there: list[str] = []
    busy, holding = threading.Event(), threading.Event()

    def heard_here(g: Grant) -> None:
        if g.task_id == "blocker":
            holding.set()
            busy.wait(10)  # the listener thread stays here until the rounds are done
        here.append((g.task_id, threading.current_thread().name))

    sub = backend.subscribe_grants(heard_here)
    other_sub = other.subscribe_grants(lambda g: there.append(g.task_id))
    try:
        backend.register(QueueConfig("q", concurrency=1))
        backend.register(QueueConfig("z", concurrency=1))
        z = backend.try_admit(Ticket("z", "z1", "i1"))
        assert isinstance(z, Admitted)
        assert isinstance(backend.try_admit(Ticket("z", "blocker", "i1")), Denied)
        assert other.release(z.slot.slot_id) is True  # another process: pub/sub only, here
        assert holding.wait(5)
        for n in range(3):
            slot = backend.try_admit(Ticket("q", f"a{n}", "i1"))
            assert isinstance(slot, Admitted)
            assert isinstance(backend.try_admit(Ticket("q", f"b{n}", "i1")), Denied)
            assert backend.release(slot.slot.slot_id) is True
            assert here[-1] == (f"b{n}", threading.current_thread().name)
            confirmed = backend.try_admit(Ticket("q", f"b{n}", "i1"))
            assert isinstance(confirmed, Admitted)
            assert backend.release(confirmed.slot.slot_id) is True  # no waiter: a plain 1
        busy.set()
        assert wait_for(lambda: len(there) == 4)
        time.sleep(0.3)  # the pub/sub copies have come by now, and were dropped
        assert sorted(t for t, _ in here) == ["b0", "b1", "b2", "blocker"]
        assert there == ["blocker", "b0", "b1", "b2"]
    finally:
        busy.set()
        sub.close()
        other_sub.close()
        other.close()


# -- keys ----------------------------------------------------------------------------------

def test_keys_stay_under_the_prefix_one_hash_tag_per_queue(backend: RedisBackend,
                                                           redis_client: redis.Redis,
                                                           key_prefix: str,
                                                           clock: FakeClock) -> None:
    token = uuid.uuid4().hex[:6]
    names = [f"fair-{token}", f"rate-{token}", f"hold-{token}"]
    backend.register(QueueConfig(names[0], concurrency=2, fairness="key", per_key_concurrency=1))
    backend.register(QueueConfig(names[1], rate_limit=RateLimit(2, 10, "sliding")))
    backend.register(QueueConfig(names[2], concurrency=1, release="manual", max_hold=60))
    for name in names:
        for i in range(6):
            backend.try_admit(Ticket(name, f"t{i}", f"inst{i % 2}", i % 3, f"key{i % 3}"))
    backend.heartbeat("inst0")
    clock.advance(1)
    backend.reclaim()
    keys = [k.decode() for k in redis_client.scan_iter(match=f"*{token}*", count=1000)]
    assert keys and all(k.startswith(f"{key_prefix}:{{") for k in keys), keys
    for key in keys:
        # The hash tag is the queue name (the cluster contract test checks the slots).
        assert key[len(key_prefix) + 2:key.index("}")] in names, key
    parts = {k.split("}:", 1)[1].split(":")[0] for k in keys}
    assert {"cfg", "slots", "waiting", "ring", "line", "held", "leases", "rate"} <= parts
    assert backend.queues() == sorted(names)
    for name in names:
        assert backend.unregister(name) is True
    assert list(redis_client.scan_iter(match=f"*{token}*", count=1000)) == []
    assert redis_client.exists(f"{key_prefix}:queues") == 0


# -- outages -------------------------------------------------------------------------------

def test_unreachable_redis_raises_backend_unavailable() -> None:
    backend = RedisBackend.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    calls: list[Callable[[], Any]] = [
        lambda: backend.try_admit(Ticket("q", "t", "i")), lambda: backend.release("q:1"),
        lambda: backend.register(QueueConfig("q")), lambda: backend.queues(),
        lambda: backend.heartbeat("i"), lambda: backend.reclaim(),
        lambda: backend.stats("q"), lambda: backend.pending_grants(),
        lambda: backend.subscribe_grants(lambda g: None),
    ]
    for call in calls:
        with pytest.raises(BackendUnavailableError) as info:
            call()
        assert isinstance(info.value, FlowControlError)
        assert isinstance(info.value.__cause__, (redis.ConnectionError, OSError))
    backend.close()


def test_scripts_reload_after_the_server_forgot_them(own_redis: RedisServer) -> None:
    backend = RedisBackend.from_url(own_redis.url)
    try:
        backend.register(QueueConfig("q", concurrency=1))
        backend.client.script_flush()
        assert isinstance(backend.try_admit(Ticket("q", "t", "i")), Admitted)
        backend.client.script_flush()
        backend.heartbeat("i")  # the pipelined path reloads too
        backend.client.script_flush()
        many = backend.try_admit_many([Ticket("q", f"m{i}", "i") for i in range(3)])
        assert [type(d) for d in many] == [Denied, Denied, Denied], "t holds the one slot"
        assert [w.task_id for w in backend.waiters("q")] == ["m0", "m1", "m2"], \
            "the calls the server refused are sent again, once each, in order"
        backend.client.script_flush()
        assert backend.reclaim().total == 0
    finally:
        backend.close()


def test_the_hot_path_survives_a_killed_connection_and_any_reply_form(own_redis: RedisServer) -> None:
    """try_admit and release read replies off the socket themselves (redis/wire.py): a
    connection the server dropped is reconnected and the call sent again; RESP3 and
    decode_responses clients get the same decisions."""
    admin = redis.Redis.from_url(own_redis.url)
    for options in ({}, {"decode_responses": True}, {"protocol": 3}):
        backend = RedisBackend(redis.Redis.from_url(own_redis.url, **options),
                               key_prefix=f"hot{len(admin.keys())}")
        try:
            backend.register(QueueConfig("q", concurrency=1, max_hold=60))
            first = backend.try_admit(Ticket("q", "a", "i", 0, "k", "label"))
            assert isinstance(first, Admitted), options
            assert first.slot.expires_at == first.slot.acquired_at + 60
            for client in admin.client_list():
                if client["cmd"] == "evalsha":
                    admin.client_kill_filter(_id=client["id"])
            denied = backend.try_admit(Ticket("q", "b", "i"))
            assert isinstance(denied, Denied) and denied.reason == "concurrency", options
            assert backend.release(first.slot.slot_id) is True
            assert backend.release(first.slot.slot_id) is False
            again = backend.try_admit(Ticket("q", "b", "i"))  # the waiter takes the slot
            assert isinstance(again, Admitted) and again.slot.task_id == "b", options
        finally:
            backend.close()
    admin.close()


# -- the Redis clock -----------------------------------------------------------------------

def test_without_a_clock_every_decision_reads_redis_time(redis_client: redis.Redis,
                                                         key_prefix: str) -> None:
    backend = RedisBackend(redis_client, key_prefix=key_prefix)
    try:
        backend.register(QueueConfig("q", concurrency=5, rate_limit=RateLimit(1, 60),
                                     max_hold=30))
        inside_one_minute()  # a fixed window: t2 is denied only in t1's minute
        sec, usec = redis_client.time()
        server_now = sec + usec / 1e6
        d = backend.try_admit(Ticket("q", "t1", "i"))
        assert isinstance(d, Admitted)
        assert abs(d.slot.acquired_at - server_now) < 2.0
        assert d.slot.acquired_at == round(d.slot.acquired_at, 3)  # whole milliseconds
        assert d.slot.expires_at == d.slot.acquired_at + 30
        denied = backend.try_admit(Ticket("q", "t2", "i"))
        assert isinstance(denied, Denied) and denied.reason == "rate"
        assert denied.retry_at == (d.slot.acquired_at // 60 + 1) * 60  # the window's end
    finally:
        backend.close()


def test_from_url_and_a_ready_client_see_one_state(redis_url: str, key_prefix: str,
                                                   redis_client: redis.Redis) -> None:
    backend = RedisBackend.from_url(redis_url, key_prefix=key_prefix, instance_ttl=45,
                                    grant_ttl=5, waiter_ttl=7)
    assert (backend.instance_ttl, backend.grant_ttl, backend.waiter_ttl) == (45.0, 5.0, 7.0)
    assert backend.redis_key("emails", "slots") == f"{key_prefix}:{{emails}}:slots"
    assert backend.channel == f"{key_prefix}:grants"
    backend.register(QueueConfig("q"))
    assert RedisBackend(redis_client, key_prefix=key_prefix).queues() == ["q"]
    backend.close()


def test_the_release_rate_reads_the_same_across_its_epochs_and_drops_the_old(
        backend: RedisBackend, redis_client: redis.Redis, key_prefix: str,
        clock: FakeClock) -> None:
    # release_fast.lua sums the releases per epoch of RATE_EPOCH_MS, in integer units: a count
    # that crosses epochs reads as ReleaseRate's, and epochs older than RATE_KEEP_MS are dropped.
    backend.register(QueueConfig("q", concurrency=2))
    epoch, keep = RATE_EPOCH_MS / 1000, RATE_KEEP_MS / 1000
    reference = ReleaseRate()
    for at in (1_000 * epoch - 20, 1_000 * epoch - 5, 1_000 * epoch + 7, 1_001 * epoch + 3,
               1_002 * epoch + 1, 1_002 * epoch + 40, 1_000 * epoch + keep + 30):
        clock.set(at)
        slot = expect_admitted(backend.try_admit(Ticket("q", f"t{at}", "i"))).slot
        assert backend.release(slot.slot_id)
        reference.tick(at)
        for later in (at, at + 25):
            clock.set(later)
            rate = backend.release_rate("q")
            assert math.isclose(rate, reference.value(later), rel_tol=1e-9), (at, later)
    fields = redis_client.hkeys(f"{key_prefix}:{{q}}:relrate")
    assert sorted(int(f) for f in fields) == [
        1_000 * RATE_EPOCH_MS, 1_001 * RATE_EPOCH_MS, 1_002 * RATE_EPOCH_MS,
        1_000 * RATE_EPOCH_MS + RATE_KEEP_MS]
