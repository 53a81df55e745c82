"""celery-flowcontrol: durable, fleet-wide flow control for Celery tasks.

A flow queue caps how much of one kind of work runs at once across a whole fleet (a
concurrency limit, a rate limit, or both); a denied task is parked in SQL, acked, and woken
when its turn comes. See README.md and docs/.
"""

from __future__ import annotations

from .beat import beat_schedule
from .collapse.batching import BatchCall
from .config import QueueConfig, RateLimit
from .errors import (
    BackendUnavailableError,
    CollapseError,
    CostRefusedError,
    FlowControlConfigError,
    FlowControlError,
    FlowQueueFull,
    InvalidTicketError,
    MissingDependencyError,
    ParkingRejectedError,
    ParkingUnavailableError,
    SettleError,
    SlotTimeoutError,
    UnknownDeadLetterError,
    UnknownQueueError,
    UnknownSlotError,
)
from .flowcontrol import FlowControl, register_queue
from .group import flow_group
from .quota_signals import backoff, settle_cost
from .slots import ReleaseResult, acquire_slot, release_slot, with_limit
from .task import FlowBackoff, FlowTask
from .tenants import pause, reset_key, resume, set_key
from .views.explain import explain
from .worker.bootstep import FlowControlStep

__all__ = [
    "BatchCall", "FlowBackoff", "FlowControl", "FlowControlStep", "FlowTask", "QueueConfig", "RateLimit",
    "ReleaseResult", "acquire_slot", "backoff", "beat_schedule", "explain", "flow_group", "pause",
    "register_queue", "release_slot", "reset_key", "resume", "set_key", "settle_cost", "with_limit",
    # every error a public function raises, all under FlowControlError (errors.py)
    "BackendUnavailableError", "CollapseError", "CostRefusedError", "FlowControlConfigError",
    "FlowControlError", "FlowQueueFull", "InvalidTicketError", "MissingDependencyError", "ParkingRejectedError",
    "ParkingUnavailableError", "SettleError", "SlotTimeoutError", "UnknownDeadLetterError",
    "UnknownQueueError", "UnknownSlotError",
]
__version__ = "0.1.0"
