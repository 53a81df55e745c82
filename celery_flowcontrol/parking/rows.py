"""Converting between :class:`ParkedMessage` and table rows, and checking what may be stored.

The checks are the store's own, not the database's: SQLite ignores VARCHAR lengths and
PostgreSQL refuses NUL characters, so every database rejects the same messages, with an error
that names the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy.exc import DataError, IntegrityError

from ..errors import ParkingRejectedError
from .model import LIMITS, DeadLetter, ParkedMessage, decode_json, encode_json

__all__ = ["RowError", "dead_letter_of", "dead_values", "finite", "message_of", "rejected_as", "row_values"]

INT32 = 2**31 - 1
INT64 = 2**63 - 1


class RowError(ValueError):
    """A message field that can't be stored; the store turns it into ``ParkingRejectedError``."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(field, detail)
        self.field = field
        self.detail = detail


def row_values(m: ParkedMessage, parked_at: float) -> dict[str, Any]:
    """The column values for ``m`` (``parked_at`` unless it has its own); :class:`RowError` if
    a field can't be stored."""
    for name in LIMITS:
        value = getattr(m, name)
        if value is None and name == "fairness_key":
            continue
        problem = _text_problem(value, LIMITS[name], allow_empty=name not in ("task_id", "queue"))
        if problem:
            raise RowError(name, problem)
    for name, low, high in (("priority", -INT32 - 1, INT32), ("attempts", 0, INT32)):
        value = getattr(m, name)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise RowError(name, f"must be an int between {low} and {high}, got {value!r:.60}")
    if not isinstance(m.body, (bytes, bytearray, memoryview)):
        raise RowError("body", f"must be bytes, got {type(m.body).__name__}")
    encoded = {}
    for name in ("headers", "properties"):
        value = getattr(m, name)
        if not isinstance(value, dict):
            raise RowError(name, f"must be a dict, got {type(value).__name__}")
        try:
            encoded[name] = encode_json(value)
        except (TypeError, ValueError) as exc:
            raise RowError(name, str(exc)) from exc
    times = {}
    for name, value in (("wake_at", m.wake_at), ("parked_at", parked_at if m.parked_at is None else m.parked_at)):
        try:
            times[name] = finite(value)
        except (TypeError, ValueError) as exc:
            raise RowError(name, str(exc)) from exc
    return {
        "task_id": m.task_id, "queue": m.queue, "task_name": m.task_name, "priority": m.priority,
        "fairness_key": m.fairness_key, "claimed_until": None, "body": bytes(m.body),
        "content_type": m.content_type, "content_encoding": m.content_encoding, "exchange": m.exchange,
        "routing_key": m.routing_key, "reason": m.reason, "attempts": m.attempts, **encoded, **times,
    }  # fmt: skip


def message_of(r: Mapping[Any, Any]) -> ParkedMessage:
    """The :class:`ParkedMessage` of a ``flowcontrol_parked`` row (column name -> value)."""
    return ParkedMessage(
        task_id=r["task_id"], queue=r["queue"], body=bytes(r["body"]), wake_at=r["wake_at"],
        task_name=r["task_name"], priority=r["priority"], fairness_key=r["fairness_key"],
        content_type=r["content_type"], content_encoding=r["content_encoding"],
        headers=decode_json(r["headers"]), properties=decode_json(r["properties"]),
        exchange=r["exchange"], routing_key=r["routing_key"], reason=r["reason"],
        attempts=r["attempts"], seq=r["seq"], parked_at=r["parked_at"], claimed_until=r["claimed_until"],
    )  # fmt: skip


def dead_letter_of(r: Mapping[Any, Any]) -> DeadLetter:
    """The :class:`DeadLetter` of a ``flowcontrol_dead`` row (column name -> value)."""
    message = ParkedMessage(
        task_id=r["task_id"], queue=r["queue"], body=bytes(r["body"]), wake_at=r["created_at"],
        task_name=r["task_name"], priority=r["priority"], fairness_key=r["fairness_key"],
        content_type=r["content_type"], content_encoding=r["content_encoding"],
        headers=decode_json(r["headers"]), properties=decode_json(r["properties"]),
        exchange=r["exchange"], routing_key=r["routing_key"], reason=r["reason"], parked_at=r["created_at"],
    )  # fmt: skip
    return DeadLetter(r["id"], r["task_id"], r["queue"], r["reason"], r["error"], r["created_at"], message)


def dead_values(m: ParkedMessage, reason: str, error: str | BaseException, now: float) -> dict[str, Any]:
    """The ``flowcontrol_dead`` column values for ``m``; never fails, whatever ``m`` holds."""

    def blob(value: Any) -> bytes:
        return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else _text(value).encode()

    def doc(value: Any) -> str:
        try:
            return encode_json(value) if isinstance(value, dict) else encode_json({"value": value})
        except (TypeError, ValueError):
            return encode_json({"repr": _text(value)})

    priority = m.priority if isinstance(m.priority, int) and -INT64 <= m.priority <= INT64 else 0
    error_text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
    return {
        "task_id": _text(m.task_id), "queue": _text(m.queue), "reason": _text(reason),
        "error": _text(error_text), "task_name": _text(m.task_name), "priority": int(priority),
        "fairness_key": None if m.fairness_key is None else _text(m.fairness_key), "body": blob(m.body),
        "content_type": _text(m.content_type), "content_encoding": _text(m.content_encoding),
        "headers": doc(m.headers), "properties": doc(m.properties), "exchange": _text(m.exchange),
        "routing_key": _text(m.routing_key), "created_at": now,
    }  # fmt: skip


def _text(value: Any) -> str:
    """Any value as text every database accepts (no NUL, no lone surrogates)."""
    text = value if isinstance(value, str) else str(value)
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _text_problem(value: Any, limit: int, *, allow_empty: bool) -> str | None:
    if not isinstance(value, str):
        return f"must be a str, got {type(value).__name__}"
    if not value and not allow_empty:
        return "must not be empty"
    if len(value) > limit:
        return f"must be at most {limit} characters, got {len(value)}"
    # PostgreSQL refuses NUL in text, and no database can store a lone surrogate.
    if "\x00" in value:
        return "must not contain NUL characters"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "must be valid Unicode (it contains a lone surrogate)"
    return None


def finite(value: float) -> float:
    """``value`` as a float of epoch seconds; ``ValueError`` for NaN and infinities."""
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"must be a finite number of epoch seconds, got {value!r}")
    return number


@contextmanager
def rejected_as(task_id: str | None) -> Iterator[None]:
    """Report the database refusing a value (a constraint, a type) as ParkingRejectedError."""
    try:
        yield
    except (IntegrityError, DataError) as exc:
        raise ParkingRejectedError(f"refused by the database: {exc.orig}", task_id) from exc
