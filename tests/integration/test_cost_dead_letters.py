"""A message whose cost no admission can take is dead-lettered with the reason, then acked.
What the gate's hook will call (worker/costs.py), on a real gate,
a real parking database and real kombu messages."""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.errors import CostRefusedError
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.protocol import read_options
from celery_flowcontrol.worker.costs import COST_REFUSED, dead_letter_cost
from celery_flowcontrol.worker.delivery import Delivery, Outcome
from tests.support.messages import TASK, make_gate, message

LLM = QueueConfig("llm", rate_limit={"limit": 1000, "period": 60, "per": "cost"})


@pytest.fixture
def world(sqlite_url: str) -> Iterator[Any]:
    store = ParkingStore(sqlite_url)
    backend = MemoryBackend()
    backend.register(LLM)
    gate = make_gate(backend, store, LLM)
    yield SimpleNamespace(gate=gate, store=store, backend=backend)
    store.close()


def delivery(world: Any, cost: Any) -> tuple[Delivery, list[bool]]:
    msg = message("llm", flow_cost=cost)
    headers = msg.headers
    acked: list[bool] = []
    d = Delivery(message=msg, task=TASK, headers=headers,
                 acker=lambda: acked.append(bool(world.store.dead_letters(5))))
    d.opts = read_options(headers, TASK)
    return d, acked


@pytest.mark.parametrize("cost", ["lots", -3, 0, [], 1001, 10**13])
def test_a_cost_no_admission_takes_is_dead_lettered_then_acked(world: Any, cost: Any) -> None:
    d, acked = delivery(world, cost)
    assert d.opts is not None
    with pytest.raises(CostRefusedError) as info:
        world.backend.try_admit(Ticket("llm", d.ticket, "w1", cost=d.opts.cost))
    assert world.backend.stats("llm").waiting == 0, "not a waiter"
    assert dead_letter_cost(world.gate.parker, d, info.value) is Outcome.PARKED
    [dead] = world.store.dead_letters(5)
    assert (dead.task_id, dead.reason, dead.queue) == (d.task_id, COST_REFUSED, "llm")
    assert "flow_cost" in dead.error
    assert acked == [True], "acked once, after the dead letter was committed"
    assert world.store.get(d.task_id) is None, "never parked to be looped"


def test_a_garbage_header_reads_as_nan() -> None:
    assert math.isnan(read_options({"flow_queue": "llm", "flow_cost": "x", "id": "1"}, TASK).cost)  # type: ignore[union-attr]


@pytest.mark.parametrize("cost", ["lots", -3, 1001])
def test_the_gate_dead_letters_a_cost_no_admission_takes(world: Any, cost: Any) -> None:
    """The gate's own decision (worker/gate.py's hook): a garbage or impossible cost is kept
    in the dead-letter table with the reason and acked after the commit; it never runs, never
    waits in line, never loops."""
    d, acked = delivery(world, cost)
    outcome = world.gate.on_message(d.message, TASK, d.ack)
    assert outcome is Outcome.PARKED and acked == [True]
    [dead] = world.store.dead_letters(5)
    assert (dead.task_id, dead.reason) == (d.task_id, COST_REFUSED)
    assert world.backend.stats("llm").waiting == 0 and world.store.get(d.task_id) is None


def test_the_gate_charges_each_message_its_cost(world: Any) -> None:
    """A per="cost" limit of 1000 a minute: a message of cost 600 is admitted, the next one of
    600 waits for the window (a rate denial, parked until it allows), one of 400 fits."""
    outcomes = []
    for cost in (600, 600, 400):
        d, _ = delivery(world, cost)
        outcomes.append(world.gate.on_message(d.message, TASK, d.ack))
    assert outcomes == [Outcome.RUN, Outcome.PARKED, Outcome.RUN]
    assert world.store.list("llm", 5)[0].reason == "rate"
