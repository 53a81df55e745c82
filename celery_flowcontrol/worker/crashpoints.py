"""Named crash points: the steps of the park path where a node may die, for fault injection.

Each step whose interruption the guarantees speak of (docs/guarantees.md, "Crash points")
calls :func:`crashpoint` with its name. It does nothing unless the environment variable
:data:`ENV` names that point when the process starts (``FLOWCONTROL_CRASH_AT=park.committed``,
or ``park.committed:3`` for its third pass); then, on that pass, the whole node dies at once:
SIGKILL to the worker's process group (the main process and every pool child, as a power cut
or the OOM killer would end it). The chaos tests (tests/chaos/test_crashpoints.py) start a node
so, let it die, start it again and count what ran.

The variable is read once, at import: off, a crash point is one comparison with ``None``.
:data:`on_crash`, if set, is called with the point's name just before the kill (the chaos
tests stamp the instant of death with it, so a run cut by the kill ends when the node died).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

__all__ = ["BATCH_POINTS", "DRAIN_POINTS", "ENV", "POINTS", "crashpoint", "on_crash"]

#: The environment variable that arms one crash point: ``NAME`` or ``NAME:N`` (the N-th pass).
ENV = "FLOWCONTROL_CRASH_AT"

#: Every named point, in the order of the data path.
POINTS = (
    "park.before_commit",   # a denied message's row not committed yet (nor the message acked)
    "park.committed",       # its row committed, the message not acked
    "park.acked",           # its row committed and the message acked
    "grant.announced",      # a slot granted to a parked waiter, its row not claimed yet
    "wake.claimed",         # a row leased by a waker, its message not published yet
    "wake.published",       # its message published again, the row not deleted yet
    "release.before",       # a task's body returned, its slot not released yet
    "release.after",        # its slot released, the message not acked yet (acks_late)
)
#: The points of a ``flow_batch`` batch's forming (tests/chaos/test_batch_kill.py), apart
#: from the park path's: a node that runs no batch never passes them.
BATCH_POINTS = (
    "batch.taken",          # a batch's run took its calls, its key not freed, nothing run yet
)
#: The drainer's own steps (worker/drain.py; tests/chaos/test_drain_kill.py), beside the park
#: path's points it passes too: a node whose consumer takes every message never passes them.
DRAIN_POINTS = (
    "drain.taken",          # messages taken off the broker in bulk, unacked, nothing committed
    "drain.committed",      # their rows committed, the messages not acked
)


def _armed(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    name, _, nth = value.partition(":")
    if name not in POINTS + BATCH_POINTS + DRAIN_POINTS:
        raise ValueError(f"{ENV}={value!r}: no crash point {name!r} (one of "
                         f"{', '.join(POINTS + BATCH_POINTS + DRAIN_POINTS)})")
    return name, int(nth) if nth else 1


_ARMED = _armed(os.environ.get(ENV))
_passes = 0
#: Called with the point's name just before the armed point kills the node (module docstring).
on_crash: Callable[[str], object] | None = None


def crashpoint(name: str) -> None:
    """Kill the whole node here if :data:`ENV` armed *name* for this pass (module docstring)."""
    global _passes
    if _ARMED is None or _ARMED[0] != name:
        return
    _passes += 1
    if _passes >= _ARMED[1]:
        try:
            if on_crash is not None:
                on_crash(name)
        finally:
            os.killpg(os.getpgid(0), signal.SIGKILL)
