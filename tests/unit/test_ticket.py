"""Ticket validation at its limits: the common-case check and the full one agree.

Every admission builds a Ticket, so ``Ticket.__post_init__`` first tries one expression that
holds for ASCII text and an int priority in range; anything else goes through the full check,
which names the field. These cases sit on each limit, on both sides, in ASCII and not.
"""

from __future__ import annotations

import pytest

from celery_flowcontrol.admission.base import Ticket
from celery_flowcontrol.errors import InvalidTicketError

OK = {"queue": "q", "task_id": "t", "instance": "i"}


@pytest.mark.parametrize("field, value", [
    ("queue", "q" * 64), ("task_id", "t" * 255), ("task_id", "é" * 127), ("instance", "i" * 255),
    ("fairness_key", ""), ("fairness_key", "k" * 256), ("fairness_key", "é" * 128),
    ("label", "x" * 256), ("label", "é" * 128), ("priority", 1_000_000), ("priority", -1_000_000),
])  # fmt: skip
def test_values_at_their_limit_are_taken(field: str, value: object) -> None:
    ticket = Ticket(**{**OK, field: value})  # type: ignore[arg-type]
    assert getattr(ticket, field) == value


@pytest.mark.parametrize("field, value", [
    ("queue", "q" * 65), ("queue", ""), ("queue", 7), ("task_id", "t" * 256), ("task_id", "é" * 128),
    ("task_id", ""), ("task_id", "t\udc80"), ("instance", "i" * 256), ("instance", ""),
    ("fairness_key", "k" * 257), ("fairness_key", "é" * 129), ("fairness_key", b"k"),
    ("label", "x" * 257), ("label", "é" * 129), ("priority", 1_000_001), ("priority", -1_000_001),
    ("priority", True), ("priority", 1.0), ("priority", "1"),
])  # fmt: skip
def test_values_past_their_limit_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(InvalidTicketError) as caught:
        Ticket(**{**OK, field: value})  # type: ignore[arg-type]
    assert caught.value.field == field
