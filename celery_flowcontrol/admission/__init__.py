"""Admission backends: decide which task may run now.

``MemoryBackend`` (in-process, the embedded default) and ``RedisBackend`` (exact across a
fleet) keep one contract, :class:`AdmissionBackend`, proven for both by
:func:`celery_flowcontrol.testing.run_admission_backend_contract`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    AdmissionBackend,
    Admitted,
    Decision,
    Denied,
    Grant,
    QueueStats,
    ReclaimReport,
    Slot,
    Subscription,
    Ticket,
    Waiter,
)
from .memory import MemoryBackend

if TYPE_CHECKING:
    from .redis import RedisBackend

__all__ = [
    "AdmissionBackend", "Admitted", "Decision", "Denied", "Grant", "MemoryBackend",
    "QueueStats", "ReclaimReport", "RedisBackend", "Slot", "Subscription", "Ticket", "Waiter",
    "backend_from_url",
]


def __getattr__(name: str) -> Any:
    # RedisBackend needs the optional redis package: import it only when asked for.
    if name == "RedisBackend":
        from .redis import RedisBackend

        return RedisBackend
    raise AttributeError(name)


def backend_from_url(url: str, **options: Any) -> AdmissionBackend:
    """Build the backend a ``flowcontrol_backend_url`` names (``memory://``, ``redis://...``).

    *options* are the backend's keyword options (``instance_ttl``, ``grant_ttl``,
    ``waiter_ttl``, and for Redis ``key_prefix``).
    """
    from ..errors import FlowControlConfigError

    scheme = url.partition("://")[0].lower()
    if scheme == "memory":
        options.pop("key_prefix", None)
        return MemoryBackend(**options)
    if scheme in ("redis", "rediss", "unix"):
        from .redis import RedisBackend

        return RedisBackend.from_url(url, **options)
    raise FlowControlConfigError(
        f"unknown scheme {scheme!r} in {url!r}: use memory:// or redis://",
        None, "flowcontrol_backend_url")
