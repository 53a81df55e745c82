"""Small helpers the conformance kit and users' tests share: a fake clock and assertions."""

from __future__ import annotations

from ..admission.base import AdmissionBackend, Admitted, Decision, Denied, Ticket


class FakeClock:
    """A clock that only moves when told, in whole milliseconds.

    Pass it as a backend's ``clock``; call it for "now". It starts on a whole second far from
    zero, so window maths that align on the epoch are exercised as in production.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move forward by *seconds*, rounded to the millisecond."""
        return self.set(self.now + seconds)

    def set(self, when: float) -> float:
        """Jump to *when*, rounded to the millisecond."""
        self.now = round(when, 3)
        return self.now


def admit(backend: AdmissionBackend, queue: str, task_id: str, *, instance: str = "i1",
          priority: int = 0, key: str = "", label: str = "", cost: float = 1) -> Decision:
    """``backend.try_admit`` with a ticket built from keywords."""
    return backend.try_admit(Ticket(queue, task_id, instance, priority, key, label, cost))


def expect_admitted(decision: Decision) -> Admitted:
    """Assert *decision* admitted, and return it."""
    assert isinstance(decision, Admitted), f"expected an admission, got {decision}"
    return decision


def expect_denied(decision: Decision, reason: str | None = None) -> Denied:
    """Assert *decision* denied (for *reason*, if given), and return it."""
    assert isinstance(decision, Denied), f"expected a denial, got {decision}"
    if reason is not None:
        assert decision.reason == reason, f"expected reason {reason!r}, got {decision}"
    return decision


def denied(decision: Decision) -> bool:
    """True if *decision* is a denial."""
    return isinstance(decision, Denied)
