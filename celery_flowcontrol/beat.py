"""Beat tasks: the safety net that runs even where no worker polls.

``flowcontrol.reclaim`` frees what lapsed (slots of dead instances, slots past max_hold,
unconfirmed grants, stale waiters); ``flowcontrol.wake_due`` republishes parked messages
whose time has come. Every worker does both on its own timer too, so beat only matters for
fleets with idle workers, or none. Merge the schedule into your app::

    app.conf.beat_schedule = {**app.conf.beat_schedule, **beat_schedule()}

With the in-process (``memory://``) backend, reclaim runs inside each worker instance
only: a beat task runs in a pool process, which cannot see its parent's memory.
"""

from __future__ import annotations

from typing import Any

from .engines import engines_of
from .worker.republish import wake_due as wake

RECLAIM = "flowcontrol.reclaim"
WAKE_DUE = "flowcontrol.wake_due"


def register_tasks(app: Any) -> None:
    """Register the two beat tasks on *app* (worker/runtime.py's ``install``)."""

    @app.task(name=RECLAIM, ignore_result=True, shared=False)
    def reclaim() -> dict[str, int]:
        engines = engines_of(app)
        if engines.backend_is_local:  # a pool process can't see its parent's memory
            return {}
        report = engines.backend.reclaim()
        return {"instances": report.instances, "max_hold": report.max_hold,
                "grants": report.grants, "waiters": report.waiters}

    @app.task(name=WAKE_DUE, ignore_result=True, shared=False)
    def wake_due() -> int:
        engines = engines_of(app)
        # A row that can't be published leaves its line too, where the line is shared.
        return wake(app, engines.store, engines.clock,
                    backend=None if engines.backend_is_local else engines.backend)


def beat_schedule(reclaim_every: float = 15.0, wake_due_every: float = 5.0) -> dict[str, Any]:
    """Entries for ``app.conf.beat_schedule``: reclaim every 15 s, wake_due every 5 s."""
    return {
        RECLAIM: {"task": RECLAIM, "schedule": reclaim_every,
                  "options": {"expires": reclaim_every}},
        WAKE_DUE: {"task": WAKE_DUE, "schedule": wake_due_every,
                   "options": {"expires": wake_due_every}},
    }
