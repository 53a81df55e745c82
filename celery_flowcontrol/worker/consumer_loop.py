"""The consumer's event loop, as the parts that send calls on it see it.

Admission calls (asking.py) and releases (release.py) are sent on the consumer's event loop
without waiting where the backend can (``AdmissionBackend.on_event_loop``: Redis with the
prefork pool). :class:`ConsumerLoop` is that loop's calls while the consumer is attached: the
one both parts read, so neither hands the other a method to reach it.
"""

from __future__ import annotations

import threading
from typing import Any

from ..admission.base import AdmissionBackend, EventLoopCalls

__all__ = ["ConsumerLoop"]


class ConsumerLoop:
    """The event loop calls of one worker instance's consumer, while attached."""

    def __init__(self, backend: AdmissionBackend) -> None:
        self.backend = backend
        #: The event loop's calls while attached (the backend's ``on_event_loop``), or None.
        self.calls: EventLoopCalls | None = None

    def attach(self, hub: Any) -> None:
        """Calls on *hub* (the consumer's event loop) from now on, when the backend can."""
        self.calls = self.backend.on_event_loop(hub)

    def detach(self) -> EventLoopCalls | None:
        """Back to waiting calls; the loop's calls that were attached, if any."""
        calls, self.calls = self.calls, None
        return calls

    def current(self) -> EventLoopCalls | None:
        """The loop's calls, when called on the loop's own thread."""
        loop = self.calls
        return loop if loop is not None and loop.thread == threading.get_ident() else None
