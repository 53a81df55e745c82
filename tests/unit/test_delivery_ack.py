"""A delivery is acked once, and an ack that finds its message acked already is logged, never
raised on the consumer's loop (it would stop the worker): a real kombu message whose ack is
called twice."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kombu.exceptions import MessageStateError

from celery_flowcontrol.worker.delivery import Delivery, DeliveryState, Outcome
from celery_flowcontrol.worker.strategy import acker_of
from tests.support.messages import message


def test_kombu_refuses_a_second_ack() -> None:
    """What the worker met: the second ack of one message raises."""
    acked: list[Any] = []
    m = message(None, id="t1", acked=acked, tag="tag-1")
    m.ack()
    with pytest.raises(MessageStateError):
        m.ack()
    assert acked == ["tag-1"]


def test_an_ack_that_finds_its_message_acked_logs_and_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    acked: list[Any] = []
    m = message(None, id="t1", acked=acked, tag="tag-1")
    ack = acker_of(m.ack_log_error, (ConnectionError,))  # what Celery's promise calls, later
    m.ack()  # acked by another path first
    with caplog.at_level(logging.CRITICAL, logger="celery_flowcontrol.worker.strategy"):
        ack()  # no raise
    assert acked == ["tag-1"]
    assert "Couldn't ack" in caplog.text and "MessageStateError" in caplog.text


def test_a_delivery_is_acked_once_whatever_decides_it(caplog: pytest.LogCaptureFixture) -> None:
    acked: list[Any] = []
    m = message(None, id="t1", acked=acked, tag="tag-1")
    state = DeliveryState()
    first = Delivery(m, None, m.headers, acker_of(m.ack_log_error, ()), state=state)
    second = Delivery(m, None, m.headers, acker_of(m.ack_log_error, ()), state=state)
    first.ack()
    with caplog.at_level(logging.ERROR, logger="celery_flowcontrol.worker.delivery"):
        second.ack()
        first.ack()
    assert acked == ["tag-1"]
    assert caplog.text.count("a second ack of one delivery is skipped") == 2


def test_only_a_final_outcome_is_recorded() -> None:
    state = DeliveryState()
    for outcome in (Outcome.ASKED, Outcome.DEFER, Outcome.LINGERING, Outcome.DECIDED):
        assert state.record(outcome) is outcome and state.outcome is None
    assert state.record(Outcome.PARKED) is Outcome.PARKED and state.outcome is Outcome.PARKED
    state.record(Outcome.RUN)  # the first final outcome stays
    assert state.outcome is Outcome.PARKED
