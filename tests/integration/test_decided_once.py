"""One delivery, one decision, one ack: on a real kombu event loop, a real Redis behind a
relay that refuses connections on cue, a real parking database (SQLite and PostgreSQL) and a
real kombu message whose ack runs on the loop, queued, as Celery's does.

The path that decided one message twice (found in the Sentinel failover test once due rows
were woken on time): an admission asked on the loop while the admission Redis refused
connections raised out of ``LoopCalls.admit`` with its call left queued, unsent. The
strategy retried the message (one decision), while the stale call kept its ticket "being
asked for" and, failed at the reply timeout, handed the message a second decision. One of the
two parked it and queued its ack; the row was woken and deleted; the other parked it again
and queued a second ack, which kombu refused with ``MessageStateError`` on the loop: the
worker stopped, and the second row would have run the task again.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.asynchronous import Hub

from celery_flowcontrol.admission import Admitted, Denied, Ticket
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.errors import BackendUnavailableError
from celery_flowcontrol.parking import ParkingStore, migrate
from celery_flowcontrol.worker.delivery import DeliveryState, Outcome
from celery_flowcontrol.worker.gate import Gate
from celery_flowcontrol.worker.strategy import acker_of
from tests.support.messages import TASK, make_gate, message
from tests.support.proxies import TcpProxy
from tests.support.waiting import spin

logger = logging.getLogger(__name__)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[ParkingStore]:
    url = str(request.getfixturevalue(f"{request.param}_url"))
    if not url.startswith("sqlite"):
        migrate(url)  # SQLite creates its tables itself
    s = ParkingStore(url)
    yield s
    s.close()


@pytest.fixture
def backend(redis_proxy: TcpProxy) -> Iterator[RedisBackend]:
    b = RedisBackend.from_url(redis_proxy.url, key_prefix=f"fct-{uuid.uuid4().hex[:8]}")
    b.register(QueueConfig("q", concurrency=1, retry=30.0))
    yield b
    b.close()


@pytest.fixture
def gate(backend: RedisBackend, store: ParkingStore) -> Iterator[Gate]:
    g = make_gate(backend, store, QueueConfig("q", concurrency=1, retry=30.0))
    yield g
    g.close()


class Broker:
    """The broker's side of one delivery: a real kombu message whose acks are counted."""

    def __init__(self, task_id: str) -> None:
        self.acked: list[Any] = []
        self.message = message("q", id=task_id, acked=self.acked)


class Strategy:
    """What strategy.py does with each outcome of one delivery, on the test's loop: Celery's
    ack queued on the loop (``call_soon``), a DEFER tried again (sooner than the worker's
    0.5 s), a fresh delivery asked on the loop, a retry asked synchronously. Each row it parks
    is woken at once (claimed, published, deleted), as the delivery's grant would."""

    def __init__(self, gate: Gate, store: ParkingStore, hub: Hub, broker: Broker) -> None:
        self.gate, self.store, self.hub, self.broker = gate, store, hub, broker
        self.state = DeliveryState()
        self.outcomes: list[Outcome] = []
        self.parks = 0
        m = broker.message

        def celery_ack(log: Any, errors: Any) -> None:  # Celery's promise: ack_log_error, soon
            hub.call_soon(functools.partial(m.ack_log_error, log, errors))

        self.acker = acker_of(celery_ack, ())

    def decide(self, attempt: int = 0) -> None:
        later = functools.partial(self.handle, attempt=0) if attempt == 0 else None
        try:
            outcome = self.gate.on_message(self.broker.message, TASK, self.acker, None, later,
                                           self.state)
        except Exception:  # the strategy's own net: the message is tried again
            logger.exception("decision failed")
            outcome = Outcome.DEFER
        self.handle(outcome, attempt)

    def handle(self, outcome: Outcome, attempt: int) -> None:
        self.outcomes.append(outcome)
        if outcome is Outcome.DEFER:
            self.hub.call_later(0.05, self.decide, attempt + 1)
        elif outcome is Outcome.PARKED:
            self.parks += 1
            task_id = str(self.broker.message.headers["id"])
            assert [r.task_id for r in self.store.claim_many([task_id])] == [task_id]
            self.store.done([task_id])


def test_a_call_that_cannot_connect_is_answered_once_and_leaves_nothing_waiting(
        backend: RedisBackend, redis_proxy: TcpProxy, hub: Hub) -> None:
    calls = backend.on_event_loop(hub)
    assert calls is not None
    redis_proxy.refusing.set()
    redis_proxy.cut()
    answers: list[Any] = []
    calls.admit(Ticket("q", "a", "w1"), answers.append)  # never raises: answered instead
    calls.release("q:1", answers.append)
    assert len(answers) == 2 and all(isinstance(a, BackendUnavailableError) for a in answers)
    assert len(calls) == 0, "nothing stays waiting for a reply that was never asked for"
    redis_proxy.refusing.clear()
    mine: list[Any] = []
    calls.admit(Ticket("q", "b", "w1"), mine.append)
    calls.admit(Ticket("q", "c", "w1"), mine.append)
    assert spin(hub, lambda: len(mine) == 2)
    # Each reply is its own call's: out of step, b would have taken a's answer.
    assert isinstance(mine[0], Admitted) and mine[0].slot.task_id == "b"
    assert isinstance(mine[1], Denied)
    assert spin(hub, lambda: False, timeout=1.5) is False and len(mine) == 2
    calls.close()


def test_an_admission_outage_at_the_ask_decides_the_delivery_once(
        gate: Gate, backend: RedisBackend, store: ParkingStore, redis_proxy: TcpProxy,
        hub: Hub) -> None:
    assert isinstance(backend.try_admit(Ticket("q", "holder", "w1")), Admitted)  # the cap is full
    gate.asks.attach(hub)
    assert gate.asks.calls is not None
    gate.asks.calls.reply_timeout = 0.3  # a call left waiting would fail at the next watch
    redis_proxy.refusing.set()
    redis_proxy.cut()  # the admission Redis goes away (a master killed)
    broker = Broker(uuid.uuid4().hex)
    strategy = Strategy(gate, store, hub, broker)
    strategy.decide()  # a fresh delivery, asked on the loop: the connection is refused
    assert spin(hub, lambda: len(strategy.outcomes) >= 3, timeout=5)
    assert set(strategy.outcomes) <= {Outcome.ASKED, Outcome.DEFER}
    redis_proxy.refusing.clear()  # back (the replica promoted): the retry parks it
    assert spin(hub, lambda: strategy.parks == 1, timeout=10), strategy.outcomes
    # Past the reply timeout and the watch that fails overdue calls, and the ack's turn.
    assert spin(hub, lambda: False, timeout=2.5) is False
    assert strategy.parks == 1, strategy.outcomes
    assert broker.acked == [broker.message.delivery_tag], "acked once, after its one park"
    assert store.get(str(broker.message.headers["id"])) is None, "no second row to run it again"
    assert strategy.outcomes.count(Outcome.PARKED) == 1
    assert Outcome.DECIDED not in strategy.outcomes, "no second decision even started"


def test_a_second_decision_of_a_decided_delivery_is_refused(
        gate: Gate, backend: RedisBackend, store: ParkingStore, hub: Hub,
        caplog: pytest.LogCaptureFixture) -> None:
    """The delivery's state machine, whatever path would decide it again: nothing is asked,
    parked or acked a second time, and the refusal is logged."""
    assert isinstance(backend.try_admit(Ticket("q", "holder", "w1")), Admitted)
    broker = Broker(uuid.uuid4().hex)
    strategy = Strategy(gate, store, hub, broker)
    strategy.decide(attempt=1)  # synchronous: denied, parked, ack queued
    assert strategy.outcomes == [Outcome.PARKED]
    with caplog.at_level(logging.ERROR, logger="celery_flowcontrol.worker.gate"):
        strategy.decide(attempt=1)  # its row woken and gone: a second park would succeed
    assert strategy.outcomes == [Outcome.PARKED, Outcome.DECIDED]
    assert "a second decision of its delivery is refused" in caplog.text
    assert strategy.parks == 1 and store.get(str(broker.message.headers["id"])) is None
    assert spin(hub, lambda: len(broker.acked) == 1)
    assert spin(hub, lambda: False, timeout=0.3) is False and len(broker.acked) == 1
