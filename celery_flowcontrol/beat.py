"""Beat tasks: the safety net that runs even where no worker polls.

``flowcontrol.reclaim`` frees what lapsed (slots of dead instances, slots past max_hold,
unconfirmed grants, stale waiters); ``flowcontrol.wake_due`` republishes parked messages
whose time has come, and starts a batch for ``flow_batch`` calls a dead producer left with
none to come. Every worker wakes due rows on its own timer too, and reclaims in the queues
where it holds slots or waits (worker/holdings.py: what a worker's sweeps cost grows with
what it holds, not with what is registered); the reclaim pass over every registered queue
is beat's, once a reclaim interval for the whole fleet (docs/sizing.md has its cost). Where
no live worker asks in a queue, a lapsed instance's slots there are freed by that pass, or
by the next admission. Merge the schedule into your app, once its settings are in
``app.conf``::

    app.conf.beat_schedule = {**app.conf.beat_schedule, **beat_schedule(app)}

The periods are ``flowcontrol_reclaim_interval`` and ``flowcontrol_wake_due_interval`` (15 s and
5 s by default); ``beat_schedule()`` without an app keeps the defaults, and keyword arguments win
over both.

With the in-process (``memory://``) backend, reclaim runs inside each worker instance
only: a beat task runs in a pool process, which cannot see its parent's memory.
"""

from __future__ import annotations

import warnings
from typing import Any

from .collapse.batching import sweep as sweep_batches
from .engines import engines_of
from .settings import FlowControlSettings, read_settings
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
        woken = wake(app, engines.store, engines.clock,
                     backend=None if engines.backend_is_local else engines.backend)
        sweep_batches(app)  # calls a dead producer left with no batch (collapse/batching.py)
        return woken


def beat_schedule(app: Any = None, legacy_wake_due_every: float | None = None, *,
                  reclaim_every: float | None = None,
                  wake_due_every: float | None = None) -> dict[str, Any]:
    """Entries for ``app.conf.beat_schedule``: ``flowcontrol.reclaim`` and ``flowcontrol.wake_due``.

    :param app: the Celery app whose ``flowcontrol_reclaim_interval`` and
        ``flowcontrol_wake_due_interval`` give the periods (read now, not cached, so a
        later ``config_from_object`` still counts for the rest); ``None``: 15 s and 5 s.
    :param reclaim_every: seconds between reclaims, winning over the setting.
    :param wake_due_every: seconds between wakes of due parked tasks, winning over the setting.

    The former form ``beat_schedule(reclaim_every, wake_due_every)`` (numbers, positionally)
    still works and warns (``DeprecationWarning``): a number is never taken for an app.
    """
    if isinstance(app, (int, float)) and not isinstance(app, bool):
        warnings.warn("beat_schedule(reclaim_every, wake_due_every) is deprecated: pass the app "
                      "first, and the periods as keywords", DeprecationWarning, stacklevel=2)
        if reclaim_every is None:
            reclaim_every = float(app)
        if wake_due_every is None and legacy_wake_due_every is not None:
            wake_due_every = float(legacy_wake_due_every)
        app = None
    elif legacy_wake_due_every is not None:
        raise TypeError("beat_schedule(app, ...): pass the periods as keywords "
                        "(reclaim_every=, wake_due_every=)")
    settings = read_settings(app) if app is not None else FlowControlSettings()
    if reclaim_every is None:
        reclaim_every = settings.reclaim_interval
    if wake_due_every is None:
        wake_due_every = settings.wake_due_interval
    return {
        RECLAIM: {"task": RECLAIM, "schedule": reclaim_every,
                  "options": {"expires": reclaim_every}},
        WAKE_DUE: {"task": WAKE_DUE, "schedule": wake_due_every,
                   "options": {"expires": wake_due_every}},
    }
