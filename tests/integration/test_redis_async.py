"""Admission calls answered on a real kombu event loop, against a real Redis (admission/redis/loop.py).

- A call returns before its reply is read; the reply comes to its callback from the loop, in
  the order the calls were sent, with the answer the waiting call would have given.
- A release's grants reach this process's listeners from the loop.
- Whatever breaks (scripts forgotten, connection killed, server silent) each waiting call gets
  its own answer or a BackendUnavailableError, and the next call works.
- The gate on the loop: ASKED, then the outcome; a second delivery waits; a consumer that
  stops meanwhile runs nothing and gives the slot back.
- Asked early (early.py), in a quiet queue only: one call per message, decided in its own turn
  when the reply is in, later when it is not; a message that never asks has its admission
  undone, unless this worker holds that ticket another way; a readiness a poll read first
  never blocks the loop.
"""

from __future__ import annotations

import functools
import select
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kombu.asynchronous import Hub

from celery_flowcontrol.admission import Admitted, Denied, Ticket
from celery_flowcontrol.admission.base import Grant
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.admission.redis import loop as redis_loop
from celery_flowcontrol.admission.redis.loop import LoopCalls
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.errors import BackendUnavailableError, UnknownQueueError
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.worker.gate import Gate, Outcome
from tests.support.messages import TASK, make_gate, message
from tests.support.proxies import TcpProxy
from tests.support.services import RedisServer
from tests.support.waiting import spin, wait_until


def make_backend(url: str, *queues: QueueConfig) -> RedisBackend:
    backend = RedisBackend.from_url(url, key_prefix=f"fct-{uuid.uuid4().hex[:8]}")
    for q in queues:
        backend.register(q)
    return backend


@contextmanager
def loop_calls(url: str, hub: Hub, *queues: QueueConfig) -> Iterator[tuple[RedisBackend, LoopCalls]]:
    """A backend on *url* with *queues*, and its calls on *hub*; both closed after."""
    backend = make_backend(url, *queues)
    try:
        calls = backend.on_event_loop(hub)
        assert calls is not None
        yield backend, calls
        calls.close()
    finally:
        backend.close()


@pytest.fixture
def backend(redis_url: str) -> Iterator[RedisBackend]:
    b = make_backend(redis_url, QueueConfig("q", concurrency=3))
    yield b
    for key in b.client.scan_iter(match=f"{b.key_prefix}*"):
        b.client.delete(key)
    b.close()


def test_calls_return_at_once_and_replies_come_in_order_from_the_loop(backend: RedisBackend,
                                                                       hub: Hub) -> None:
    calls = backend.on_event_loop(hub)
    assert calls is not None
    answers: list[Any] = []
    for n in range(6):
        calls.admit(Ticket("q", f"t{n}", "w1"), answers.append)
    assert answers == [] and len(calls) == 6  # all six on the wire, none waited for
    assert spin(hub, lambda: len(answers) == 6)
    assert [type(a) for a in answers] == [Admitted] * 3 + [Denied] * 3
    assert [a.slot.task_id for a in answers[:3]] == ["t0", "t1", "t2"]
    assert {a.reason for a in answers[3:]} == {"concurrency"}
    released: list[Any] = []
    calls.release(answers[0].slot.slot_id, released.append)
    calls.release(answers[0].slot.slot_id, released.append)  # idempotent, as the waiting call
    calls.release("q:not-a-number", released.append)  # no such slot can exist: at once
    assert released == [False]
    assert spin(hub, lambda: len(released) == 3)
    assert released == [False, True, False]
    assert [s.task_id for s in backend.busy_slots("q")] == ["t1", "t2"]
    calls.close()
    assert hub.readers == {}


def test_a_release_hands_its_grants_to_this_process_from_the_loop(redis_url: str, hub: Hub) -> None:
    heard: list[Grant] = []
    with loop_calls(redis_url, hub, QueueConfig("one", concurrency=1)) as (backend, calls):
        sub = backend.subscribe_grants(heard.append)
        first = backend.try_admit(Ticket("one", "a", "w1"))
        assert isinstance(first, Admitted)
        assert isinstance(backend.try_admit(Ticket("one", "b", "w1")), Denied)
        done: list[Any] = []
        calls.release(first.slot.slot_id, done.append)
        assert spin(hub, lambda: done == [True])
        # Delivered on the loop with the reply, before the pub/sub copy could matter.
        assert [g.task_id for g in heard] == ["b"]
        sub.close()


def test_forgotten_scripts_load_again_and_the_call_is_answered(own_redis: RedisServer, hub: Hub) -> None:
    with loop_calls(own_redis.url, hub, QueueConfig("q", concurrency=1)) as (backend, calls):
        backend.client.script_flush()
        answers: list[Any] = []
        calls.admit(Ticket("q", "a", "w1"), answers.append)
        calls.admit(Ticket("q", "b", "w1"), answers.append)
        assert spin(hub, lambda: len(answers) == 2)
        assert [type(a) for a in answers] == [Admitted, Denied]


def test_a_dropped_connection_fails_the_waiting_calls_and_the_next_one_reconnects(
        redis_proxy: TcpProxy, hub: Hub) -> None:
    with loop_calls(redis_proxy.url, hub, QueueConfig("q", concurrency=5)) as (backend, calls):
        first: list[Any] = []
        calls.admit(Ticket("q", "a", "w1"), first.append)
        assert spin(hub, lambda: len(first) == 1)
        # The network fails with two calls on the wire: their answers never come.
        redis_proxy.silent.set()
        waiting: list[Any] = []
        calls.admit(Ticket("q", "b", "w1"), waiting.append)
        calls.release(first[0].slot.slot_id, waiting.append)
        spin(hub, lambda: False, timeout=0.2)
        assert waiting == []
        redis_proxy.cut()
        redis_proxy.silent.clear()
        assert spin(hub, lambda: len(waiting) == 2)
        assert all(isinstance(w, BackendUnavailableError) for w in waiting), waiting
        again: list[Any] = []
        calls.admit(Ticket("q", "b", "w1"), again.append)  # the same ticket, asked again
        calls.release(first[0].slot.slot_id, again.append)
        assert spin(hub, lambda: len(again) == 2)
        assert isinstance(again[0], Admitted) and again[0].slot.task_id == "b"
        assert again[1] is True  # the lost release had landed: it was busy, and freed now


def test_a_server_that_does_not_answer_fails_the_calls_after_the_reply_timeout(
        redis_proxy: TcpProxy, hub: Hub) -> None:
    with loop_calls(redis_proxy.url, hub, QueueConfig("q", concurrency=5)) as (backend, calls):
        calls.reply_timeout = 0.2
        answers: list[Any] = []
        calls.admit(Ticket("q", "warm", "w1"), answers.append)
        assert spin(hub, lambda: len(answers) == 1)
        redis_proxy.silent.set()
        started = time.monotonic()
        calls.admit(Ticket("q", "a", "w1"), answers.append)
        assert spin(hub, lambda: len(answers) == 2, timeout=3)
        assert isinstance(answers[1], BackendUnavailableError)
        assert "no reply within 0.2 s" in str(answers[1])
        assert time.monotonic() - started < 2.0  # the watch looks every second
        redis_proxy.silent.clear()
        calls.admit(Ticket("q", "b", "w1"), answers.append)  # a new connection answers
        assert spin(hub, lambda: len(answers) == 3)
        assert isinstance(answers[2], Admitted)


def test_an_unknown_queue_is_the_callers_error_alone(backend: RedisBackend, hub: Hub) -> None:
    calls = backend.on_event_loop(hub)
    assert calls is not None
    answers: list[Any] = []
    calls.admit(Ticket("nope", "a", "w1"), answers.append)
    calls.admit(Ticket("q", "b", "w1"), answers.append)
    assert spin(hub, lambda: len(answers) == 2)
    assert isinstance(answers[0], UnknownQueueError) and isinstance(answers[1], Admitted)
    calls.close()


def test_close_hands_over_the_replies_still_due(backend: RedisBackend, hub: Hub) -> None:
    calls = backend.on_event_loop(hub)
    assert calls is not None
    answers: list[Any] = []
    for n in range(3):
        calls.admit(Ticket("q", f"t{n}", "w1"), answers.append)
    calls.close()  # no loop ran: close reads them itself
    assert [type(a) for a in answers] == [Admitted] * 3
    assert hub.readers == {}


# -- the gate on the loop ----------------------------------------------------------------

@pytest.fixture
def gate(backend: RedisBackend, sqlite_url: str) -> Iterator[Gate]:
    store = ParkingStore(sqlite_url)
    g = make_gate(backend, store, QueueConfig("q", concurrency=3))
    yield g
    g.close()
    store.close()


def test_the_gate_asks_on_the_loop_and_hands_the_outcome_over_later(gate: Gate, hub: Hub) -> None:
    gate.asks.attach(hub)
    outcomes: list[Outcome] = []
    acks: list[str] = []
    m = message("q", id="a")
    assert gate.on_message(m, TASK, lambda: acks.append("a"), None, outcomes.append) is Outcome.ASKED
    # A second delivery of the same message while the first is being asked for waits.
    assert gate.on_message(message("q", id="a"), TASK, lambda: None, None, outcomes.append) is Outcome.DEFER
    assert outcomes == []
    assert spin(hub, lambda: outcomes == [Outcome.RUN])
    assert gate.ledger.get(("a", m.delivery_tag)) is not None
    # Without a callback, or off the loop's thread, the gate waits for its answer in the call.
    assert gate.on_message(message("q", id="b"), TASK, lambda: None) is Outcome.RUN
    gate.releaser.finish("a", m.delivery_tag)  # released on the loop
    assert spin(hub, lambda: [s.task_id for s in gate.backend.busy_slots("q")] == ["b"])


def test_a_flow_groups_queue_goes_once_its_last_release_on_the_loop_is_in(gate: Gate, hub: Hub) -> None:
    """A flow_group's queue is unregistered when its members are done and it is idle. On the
    loop a quiet queue's release waits for the next send: asking to unregister before it is
    in found the queue busy, and the queue stayed in Redis after its group had ended."""
    fg = "fg.0123abcd.2"
    gate.backend.register(QueueConfig(fg, concurrency=2))
    gate.asks.attach(hub)
    outcomes: list[Outcome] = []
    members = [message(fg, id=t) for t in ("a", "b")]
    for m in members:
        assert gate.on_message(m, TASK, lambda: None, None, outcomes.append) is Outcome.ASKED
    assert spin(hub, lambda: outcomes == [Outcome.RUN, Outcome.RUN])
    assert gate.asks.calls is not None and gate.asks.calls.quiet(fg)  # its releases wait for a send
    gate.releaser.finish("a", members[0].delivery_tag)
    assert spin(hub, lambda: [s.task_id for s in gate.backend.busy_slots(fg)] == ["b"])
    assert fg in gate.backend.queues()  # a member still runs
    gate.releaser.finish("b", members[1].delivery_tag)
    assert spin(hub, lambda: fg not in gate.backend.queues())


def test_a_consumer_that_stops_while_asking_runs_nothing_and_frees_the_slot(gate: Gate, hub: Hub) -> None:
    gate.asks.attach(hub)
    outcomes: list[Outcome] = []
    for task_id in ("a", "b"):
        assert gate.on_message(message("q", id=task_id), TASK, lambda: None, None,
                               outcomes.append) is Outcome.ASKED
    gate.asks.detach()  # the bootstep's stop: the channel closes, the messages go back
    assert outcomes == []
    assert gate.backend.busy_slots("q") == []
    assert len(gate.ledger) == 0
    assert hub.readers == {}


@contextmanager
def gate_through(proxy: TcpProxy, sqlite_url: str) -> Iterator[Gate]:
    """A gate on a queue "q" of 3 whose backend talks to Redis through *proxy*."""
    backend = make_backend(proxy.url, QueueConfig("q", concurrency=3))
    store = ParkingStore(sqlite_url)
    gate = make_gate(backend, store, QueueConfig("q", concurrency=3))
    try:
        yield gate
    finally:
        gate.close()
        store.close()
        backend.close()


def test_an_outage_while_asking_defers_the_message(redis_proxy: TcpProxy, sqlite_url: str,
                                                   hub: Hub) -> None:
    with gate_through(redis_proxy, sqlite_url) as gate:
        gate.asks.attach(hub)
        outcomes: list[Outcome] = []
        assert gate.on_message(message("q", id="warm"), TASK, lambda: None, None,
                               outcomes.append) is Outcome.ASKED
        assert spin(hub, lambda: outcomes == [Outcome.RUN])
        redis_proxy.silent.set()
        assert gate.on_message(message("q", id="a"), TASK, lambda: None, None,
                               outcomes.append) is Outcome.ASKED
        redis_proxy.cut()
        assert spin(hub, lambda: len(outcomes) == 2)
        assert outcomes[1] is Outcome.DEFER  # unacked, tried again later: nothing lost
        redis_proxy.silent.clear()
        assert gate.on_message(message("q", id="a"), TASK, lambda: None, None,
                               outcomes.append) is Outcome.ASKED
        assert spin(hub, lambda: len(outcomes) == 3)
        assert outcomes[2] is Outcome.RUN


def test_a_quiet_queues_release_rides_with_the_next_admission(backend: RedisBackend, hub: Hub,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No waiter anywhere: a release waits for the next admission's send (LINGER at most)."""
    monkeypatch.setattr(redis_loop, "LINGER", 0.3)
    calls = backend.on_event_loop(hub)
    assert calls is not None
    answers: list[Any] = []
    calls.admit(Ticket("q", "a", "w1"), answers.append)
    assert spin(hub, lambda: len(answers) == 1)  # the fast path: the queue is quiet
    calls.release(answers[0].slot.slot_id, answers.append)
    spin(hub, lambda: False, timeout=0.05)
    assert [s.task_id for s in backend.busy_slots("q")] == ["a"]  # not sent yet
    calls.admit(Ticket("q", "b", "w1"), answers.append)  # one send for both
    assert spin(hub, lambda: len(answers) == 3)
    assert answers[1] is True and isinstance(answers[2], Admitted)
    assert [s.task_id for s in backend.busy_slots("q")] == ["b"]
    started = time.monotonic()
    calls.release(answers[2].slot.slot_id, answers.append)  # no admission follows
    assert spin(hub, lambda: len(answers) == 4)
    assert answers[3] is True and 0.25 < time.monotonic() - started < 2.0
    calls.close()


def test_lazy_releases_share_one_linger_timer(backend: RedisBackend, hub: Hub,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A timer per lazy release cost the loop more than the release: one is armed at a
    time, it is not cancelled when the releases go out with an admission, and a release
    made after it was armed still waits its whole LINGER (the timer sets itself again)."""
    monkeypatch.setattr(redis_loop, "LINGER", 0.3)
    calls = backend.on_event_loop(hub)
    assert calls is not None
    armed: list[float] = []
    call_later = hub.call_later
    monkeypatch.setattr(hub, "call_later", lambda d, *a: armed.append(d) or call_later(d, *a))
    answers: list[Any] = []
    calls.admit(Ticket("q", "t0", "w1"), answers.append)
    assert spin(hub, lambda: len(answers) == 1)
    for n in range(1, 6):  # release the last slot, admit the next: one send each time
        calls.release(answers[-1].slot.slot_id, answers.append)
        calls.admit(Ticket("q", f"t{n}", "w1"), answers.append)
        assert spin(hub, lambda n=n: len(answers) == 2 * n + 1)
    assert answers[1::2] == [True] * 5
    assert armed == [0.3]  # one timer for the five lazy releases
    spin(hub, lambda: False, timeout=0.2)
    started = time.monotonic()
    calls.release(answers[-1].slot.slot_id, answers.append)  # no admission follows
    assert spin(hub, lambda: len(answers) == 12)
    assert answers[-1] is True and 0.28 < time.monotonic() - started < 2.0
    assert len(armed) == 2 and 0 < armed[1] <= 0.3  # the first fired early, and set itself again
    assert backend.busy_slots("q") == []
    calls.close()


def test_a_release_goes_out_in_its_turn_once_the_queue_has_waiters(
        redis_url: str, hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_loop, "LINGER", 30.0)
    heard: list[Grant] = []
    with loop_calls(redis_url, hub, QueueConfig("one", concurrency=1)) as (backend, calls):
        sub = backend.subscribe_grants(heard.append)
        answers: list[Any] = []
        calls.admit(Ticket("one", "a", "w1"), answers.append)
        calls.admit(Ticket("one", "b", "w1"), answers.append)  # denied: a waiter
        assert spin(hub, lambda: len(answers) == 2)
        assert isinstance(answers[0], Admitted) and isinstance(answers[1], Denied)
        calls.release(answers[0].slot.slot_id, answers.append)
        assert spin(hub, lambda: len(answers) == 3, timeout=5.0)  # not 30 s
        assert answers[2] is True
        assert wait_until(lambda: [g.task_id for g in heard] == ["b"], 5)
        sub.close()


# -- asked early (early.py) -------------------------------------------------------------------
def warm(gate: Gate, hub: Hub) -> Any:
    """Attach *gate* to *hub* and admit one message the usual way: the queue is quiet now."""
    gate.asks.attach(hub)
    outcomes: list[Outcome] = []
    assert gate.on_message(message("q", id="warm"), TASK, lambda: None, None,
                           outcomes.append) is Outcome.ASKED
    assert spin(hub, lambda: outcomes == [Outcome.RUN])
    calls = gate.asks.calls
    assert calls is not None and calls.quiet("q")
    return calls


def test_a_message_asked_early_is_decided_in_its_own_turn(gate: Gate, hub: Hub) -> None:
    calls = warm(gate, hub)
    outcomes: list[Outcome] = []
    acks: list[str] = []
    for task_id in ("a", "b", "c"):  # a queue of 3, warm holds one: c is denied, and parked
        m = message("q", id=task_id)
        gate.asks.ask_early(m, TASK)  # sent before kombu's own round trip for the message
        assert len(calls) == 1
        time.sleep(0.05)  # that round trip: the reply comes in meanwhile
        outcome = gate.on_message(m, TASK, functools.partial(acks.append, task_id), None,
                                  outcomes.append)
        assert len(calls) == 0  # the early call answered it: none asked again
        assert outcome is (Outcome.PARKED if task_id == "c" else Outcome.RUN)
        assert (gate.ledger.get((task_id, m.delivery_tag)) is None) == (task_id == "c")
    assert outcomes == [] and acks == ["c"]  # all decided in their own turn
    assert sorted(s.task_id for s in gate.backend.busy_slots("q")) == ["a", "b", "warm"]
    assert gate.store.get("c") is not None
    # c found a line: the queue is not quiet, and the next message is not asked for early.
    assert not calls.quiet("q")
    m = message("q", id="d")
    gate.asks.ask_early(m, TASK)
    assert len(calls) == 0
    assert gate.on_message(m, TASK, lambda: None, None, outcomes.append) is Outcome.ASKED
    assert spin(hub, lambda: outcomes == [Outcome.PARKED])


def test_a_reply_not_in_yet_comes_to_the_callback(redis_proxy: TcpProxy, sqlite_url: str,
                                                  hub: Hub) -> None:
    with gate_through(redis_proxy, sqlite_url) as gate:
        calls = warm(gate, hub)
        outcomes: list[Outcome] = []
        redis_proxy.silent.set()
        m = message("q", id="a")
        gate.asks.ask_early(m, TASK)
        assert len(calls) == 1
        time.sleep(0.05)
        assert gate.on_message(m, TASK, lambda: None, None, outcomes.append) is Outcome.ASKED
        redis_proxy.silent.clear()
        assert spin(hub, lambda: outcomes == [Outcome.RUN])
        assert gate.ledger.get(("a", m.delivery_tag)) is not None


def test_an_early_admission_whose_message_never_asks_is_undone(gate: Gate, hub: Hub) -> None:
    calls = warm(gate, hub)
    backend = gate.backend
    gate.asks.ask_early(message("q", id="a"), TASK)  # revoked, say: the strategy never asks for it
    assert len(calls) == 1
    assert spin(hub, lambda: [s.task_id for s in backend.busy_slots("q")] == ["warm"])
    for task_id in ("y", "z"):  # another worker fills the queue: this one does not know
        assert isinstance(backend.try_admit(Ticket("q", task_id, "w2")), Admitted)
    gate.asks.ask_early(message("q", id="b"), TASK)  # denied: it joined the line
    assert len(calls) == 1
    assert spin(hub, lambda: backend.stats("q").waiting == 0 and len(gate.asks.calls or ()) == 0)
    assert backend.waiters("q") == []  # and left it again
    assert len(gate.ledger) == 1  # warm's alone: nothing asked early runs here


def test_an_early_admission_is_kept_while_this_worker_holds_its_ticket(gate: Gate, hub: Hub) -> None:
    warm(gate, hub)
    first = message("q", id="a")
    gate.asks.ask_early(first, TASK)
    # Another delivery of the same message, decided here meanwhile without the loop: it gets
    # the same slot (admission is idempotent by ticket) and runs.
    copy = message("q", id="a")
    assert gate.on_message(copy, TASK, lambda: None) is Outcome.RUN
    assert spin(hub, lambda: len(gate.asks.calls or ()) == 0)  # the early reply: nobody took it
    spin(hub, lambda: False, timeout=0.05)
    assert sorted(s.task_id for s in gate.backend.busy_slots("q")) == ["a", "warm"]  # kept
    gate.releaser.finish("a", copy.delivery_tag)
    assert spin(hub, lambda: [s.task_id for s in gate.backend.busy_slots("q")] == ["warm"])


def test_a_readiness_a_poll_read_first_does_not_block_the_loop(backend: RedisBackend,
                                                               hub: Hub) -> None:
    calls = backend.on_event_loop(hub)
    assert calls is not None
    answers: list[Any] = []
    calls.admit(Ticket("q", "a", "w1"), answers.append)
    assert select.select([calls._fd], [], [], 5)[0]  # the hub would see it ready now...
    calls.poll()  # ...but a poll reads it first
    assert len(answers) == 1 and isinstance(answers[0], Admitted)
    late = threading.Thread(target=calls._on_readable, daemon=True)  # the hub's callback
    late.start()
    late.join(2.0)
    assert not late.is_alive()  # found nothing and returned: the loop goes on
    calls.admit(Ticket("q", "b", "w1"), answers.append)
    assert spin(hub, lambda: len(answers) == 2)
    calls.close()
