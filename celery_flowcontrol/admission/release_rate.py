"""How fast a queue gives its slots back lately (``AdmissionBackend.release_rate``).

A queue's releases are kept as one decayed count, two numbers whatever the traffic: each
release adds ``1 / RELEASE_TAU`` to a rate that decays by ``exp(-dt / RELEASE_TAU)``, so the
figure is the releases per second of about the last ``RELEASE_TAU`` seconds, the newest
weighing most (a steady rate r reads r once it has run a few TAU). ``explain`` turns it into
an estimated start for a task that waits for a slot: its place in line over this rate. The
Redis release script keeps the same count as one sum per epoch of a minute, in integer units,
each release adding its own term in one write (release_fast.lua), and reads back the same
figure (to rounding far below 1e-9 of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RELEASE_TAU", "ReleaseRate"]

#: The time constant of the decay, seconds: about the span a release rate describes.
RELEASE_TAU = 60.0


@dataclass
class ReleaseRate:
    """One queue's decayed release count: *rate* (releases per second) as of *at*."""

    rate: float = 0.0
    at: float | None = None

    def tick(self, now: float) -> None:
        """One release at *now*."""
        self.rate = self.value(now) + 1.0 / RELEASE_TAU
        self.at = now

    def value(self, now: float) -> float:
        """Releases per second as of *now* (0.0 before the first)."""
        if self.at is None:
            return 0.0
        return self.rate * math.exp(-max(0.0, now - self.at) / RELEASE_TAU)
