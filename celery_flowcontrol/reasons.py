"""Why a task waits: the one list of reasons, the same strings everywhere.

A parked row's ``reason``, the ``PARKED`` state's meta, :func:`~celery_flowcontrol.explain`,
the metrics' ``reason`` label and the CLI all say one of :data:`REASONS`. The admission
contract keeps its own short names for a :class:`~celery_flowcontrol.admission.values.Denied`
(custom backends return them); :func:`reason_of` maps those, and the names rows written before
this list carried, onto it. Why a message was dead-lettered instead (it can never run by
waiting) is one of :class:`DeadReason`, the ``reason`` of a ``flowcontrol_dead`` row.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["FOR_A_SLOT", "REASONS", "DeadReason", "Reason", "reason_of"]


class Reason(str, Enum):
    """What holds a waiting task (its value is the string shown everywhere)."""

    CONCURRENCY = "concurrency"  # every slot of the queue is busy
    KEY_CONCURRENCY = "key-concurrency"  # its fairness key holds all the slots it may
    RATE = "rate"  # a rate window of the queue is full
    KEY_RATE = "key-rate"  # a rate window of its fairness key is full
    BACKOFF = "backoff"  # a FlowBackoff (or backoff()) pauses the queue or its key
    PAUSED = "paused"  # an operator paused the queue or its key
    ETA = "eta"  # its ETA or countdown has not come yet
    DEBOUNCE = "debounce"  # a debounced burst is gathering
    BATCH = "batch"  # a batch of calls is gathering
    GRANT = "grant"  # a slot is reserved for it: its message is on its way

    def __str__(self) -> str:
        return self.value


class DeadReason(str, Enum):
    """Why a message was dead-lettered (its value is the string the dead-letter table, the
    CLI, the dashboard and the metrics show). Every dead-lettering names one."""

    PARK_REJECTED = "park-rejected"  # the parking table can never store it
    COST_REFUSED = "cost-refused"  # its cost is above what any admission of its queue takes
    WAKE_FAILED = "wake-failed"  # its parked row could not be published again

    def __str__(self) -> str:
        return self.value


#: Every reason, as the strings rows, metrics and the CLI carry.
REASONS: tuple[str, ...] = tuple(r.value for r in Reason)

#: The rows that wait for a slot (their grant wakes them), in every spelling a row may carry.
FOR_A_SLOT = frozenset({Reason.CONCURRENCY.value, Reason.KEY_CONCURRENCY.value, "per_key"})

# The admission contract's names and the names older rows carry.
_ALIASES = {
    "per_key": Reason.KEY_CONCURRENCY,
    "acquire": Reason.CONCURRENCY,  # acquire_slot waits for a slot of the queue it names
    "batch-call": Reason.BATCH,  # a call of a flow_batch task waiting for its batch's run
}


def reason_of(raw: object) -> Reason | None:
    """The :class:`Reason` *raw* names (one of :data:`REASONS`, a denial's ``per_key``, an
    older row's ``acquire``), or ``None`` for anything else (a requeued dead letter...)."""
    if isinstance(raw, Reason):
        return raw
    if not isinstance(raw, str):
        return None
    alias = _ALIASES.get(raw)
    if alias is not None:
        return alias
    try:
        return Reason(raw)
    except ValueError:
        return None
