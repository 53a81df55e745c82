"""Admission backends: decide which task may run now.

``MemoryBackend`` (in-process, the embedded default) and ``RedisBackend`` (exact across a
fleet) keep one contract, :class:`AdmissionBackend`, proven for both by
:func:`celery_flowcontrol.testing.run_admission_backend_contract`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .base import (
    AdmissionBackend,
    Admitted,
    Decision,
    Denied,
    Grant,
    KeyStats,
    QueueStats,
    ReclaimReport,
    Refused,
    Slot,
    Subscription,
    Ticket,
    Waiter,
)
from .memory import MemoryBackend

if TYPE_CHECKING:
    from .redis import RedisBackend

__all__ = [
    "AdmissionBackend", "Admitted", "Decision", "Denied", "Grant", "KeyStats", "MemoryBackend",
    "QueueStats", "ReclaimReport", "RedisBackend", "Refused", "Slot", "Subscription", "Ticket", "Waiter",
    "REDIS_SCHEMES", "backend_from_url",
]


def __getattr__(name: str) -> Any:
    # RedisBackend needs the optional redis package: import it only when asked for.
    if name == "RedisBackend":
        from .redis import RedisBackend

        return RedisBackend
    raise AttributeError(name)


#: The schemes of ``flowcontrol_backend_url`` that name a Redis (admission/redis/urls.py).
REDIS_SCHEMES = ("redis", "rediss", "unix", "sentinel", "redis+cluster", "rediss+cluster")


def backend_from_url(url: str, options: Mapping[str, Any] | None = None,
                     **backend_options: Any) -> AdmissionBackend:
    """Build the backend a ``flowcontrol_backend_url`` names (``memory://``, ``redis://...``,
    ``sentinel://...``, ``redis+cluster://...``).

    *options* are ``flowcontrol_backend_options`` (connection options of a Redis URL: master
    name, passwords, TLS); *backend_options* the backend's keyword options (``instance_ttl``,
    ``grant_ttl``, ``waiter_ttl``, and for Redis ``key_prefix``).
    """
    from ..errors import FlowControlConfigError

    scheme = url.partition("://")[0].lower()
    if scheme == "memory":
        if options:
            raise FlowControlConfigError(
                f"must be empty with memory:// (it connects to nothing), got {dict(options)!r}",
                None, "flowcontrol_backend_options")
        backend_options.pop("key_prefix", None)
        return MemoryBackend(**backend_options)
    if scheme in REDIS_SCHEMES:
        from .redis import RedisBackend

        return RedisBackend.from_url(url, options=options, **backend_options)
    raise FlowControlConfigError(
        f"unknown scheme {scheme!r} in {url!r}: use memory://, "
        f"{', '.join(s + '://' for s in REDIS_SCHEMES)}", None, "flowcontrol_backend_url")
