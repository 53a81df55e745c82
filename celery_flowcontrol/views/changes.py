"""The operator actions: release a busy slot, override a queue's capacity, max hold or rate
limits.

Each goes through the admission backend's own API (``release``, ``set_capacity``,
``set_max_hold``, ``set_rate_limit``), so it acts fleet-wide on a shared backend, and returns
what changed.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import FlowControlConfigError, UnknownSlotError
from .queues import QueueRow, queue_row
from .slot_rows import queue_of_slot

__all__ = ["UnknownSlotError", "parse_rate_text", "release", "set_capacity", "set_max_hold",
           "set_rate_limit"]


def release(fc: Any, slot_id: str) -> str:
    """Release busy slot *slot_id*; returns its queue. :class:`UnknownSlotError` if not busy."""
    queue = queue_of_slot(slot_id)
    if queue is None:
        raise UnknownSlotError(slot_id, "is not a slot id (they look like 'queue:42')")
    fc.backend.get_config(queue)  # UnknownQueueError names the queue
    if not fc.backend.release(slot_id):
        raise UnknownSlotError(slot_id)
    return queue


def set_capacity(fc: Any, name: str, value: str | int | None) -> QueueRow:
    """Override *name*'s capacity (``None`` or ``"reset"`` resets it); the queue's new row."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "reset":
            value = None
        elif text.isdigit():
            value = int(text)
        else:
            fc.backend.get_config(name)  # an unknown queue is named before a bad value
            raise FlowControlConfigError(f"override must be an int or 'reset', got {value!r}",
                                         name, "capacity")
    fc.backend.set_capacity(name, value)
    return queue_row(fc, name)


def set_max_hold(fc: Any, name: str, value: str | float | None) -> QueueRow:
    """Override *name*'s max_hold (``None`` or ``"reset"`` resets it); the queue's new row."""
    if isinstance(value, str) and value.strip().lower() == "reset":
        value = None
    fc.backend.set_max_hold(name, value)
    return queue_row(fc, name)


def parse_rate_text(name: str, value: str) -> Any:
    """Rate limits as an operator types them: ``"reset"`` (``None``), one ``"500/m"``, several
    (``"500/m, 10000/d"`` or ``"500/m 10000/d"``), or JSON (a dict or a list of them, for
    ``per``, ``algorithm``, ``burst``, ``adaptive``)."""
    text = value.strip()
    if text.lower() == "reset":
        return None
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise FlowControlConfigError(f"is not valid JSON ({exc}), got {value!r}", name,
                                         "rate_limit") from None
    parts = text.replace(",", " ").split()
    if not parts:
        raise FlowControlConfigError("needs a limit such as '500/m' (or 'reset'), got ''", name,
                                     "rate_limit")
    return parts[0] if len(parts) == 1 else parts


def set_rate_limit(fc: Any, name: str, value: Any) -> QueueRow:
    """Override *name*'s rate limits (text as :func:`parse_rate_text` reads it, or the forms
    ``rate_limit`` takes; ``None`` or ``"reset"`` resets them); the queue's new row."""
    if isinstance(value, str):
        try:
            value = parse_rate_text(name, value)
        except FlowControlConfigError:
            fc.backend.get_config(name)  # an unknown queue is named before a bad value
            raise
    fc.backend.set_rate_limit(name, value)
    return queue_row(fc, name)
