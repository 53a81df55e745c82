"""The operator actions: release a busy slot, override a queue's capacity or max hold.

Each goes through the admission backend's own API (``release``, ``set_capacity``,
``set_max_hold``), so it acts fleet-wide on a shared backend, and returns what changed.
"""

from __future__ import annotations

from typing import Any

from ..errors import FlowControlConfigError, FlowControlError
from .queues import QueueRow, queue_row
from .slots import queue_of_slot

__all__ = ["UnknownSlotError", "release", "set_capacity", "set_max_hold"]


class UnknownSlotError(FlowControlError):
    """A slot id that is not busy: released before, reclaimed, or never existed."""

    def __init__(self, slot_id: str, detail: str = "is not busy (released, reclaimed, or never existed)"):
        super().__init__(slot_id, detail)
        self.slot_id = slot_id
        self.detail = detail

    def __str__(self) -> str:
        return f"slot {self.slot_id!r} {self.detail}"


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
