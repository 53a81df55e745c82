"""Unequal tenants at run time: a key's own weight and caps, and pausing a queue or one key.

The functions operators and applications call (docs/tenants.md): :func:`set_key` and
:func:`reset_key` override one fairness key's settings of a ``fairness="key"`` queue, and
:func:`pause` / :func:`resume` stop and restart admissions of a queue or of one of its keys.
Each acts fleet-wide through the admission backend (on Redis, every worker sees it at its next
decision; on the in-process backend, through the worker that holds it, as ``capacity`` does)
and wins over the queue's config until it is reset or resumed. Values are checked by the same
rules as ``keys=`` in config: a bad one is a :class:`~celery_flowcontrol.FlowControlConfigError`
naming the queue, the key and the field.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from .config import KeyConfig, parse_duration
from .errors import FlowControlConfigError
from .parking.paused import PausedRows
from .room import forget_bounds

__all__ = ["key_changes", "pause", "pause_end", "pause_until", "reset_key", "resume", "set_key",
           "wake_paused"]

#: The fields of a key :func:`set_key` takes, as ``KeyConfig`` names them.
KEY_FIELDS = ("weight", "concurrency", "rate_limit", "reserve", "max_waiting")


def _fc(app: Any) -> Any:
    from .flowcontrol import FlowControl

    return FlowControl(app)


def set_key(app: Any, queue: str, key: str, *, weight: float | None = None,
            concurrency: int | None = None, rate_limit: Any = None, reserve: int | None = None,
            max_waiting: int | None = None) -> KeyConfig:
    """Override fairness key *key*'s settings in flow queue *queue*, fleet-wide, until
    :func:`reset_key`; the fields not given keep what they were (an earlier override, else
    ``keys=``, else the queue's per-key defaults). Returns the key's settings now in force.

    Typical use: give your premium tenants more from your own database at deploy or sign-up
    (``set_key(app, "reports", customer.id, weight=5, concurrency=10)``).

    :param app: the Celery app.
    :param queue: the flow queue's name (a ``fairness="key"`` queue).
    :param key: the fairness key (the tenant), a str of at most 256 UTF-8 bytes.
    :param weight: its share while several keys wait, any number > 0 (default 1).
    :param concurrency: the most slots it may hold at once.
    :param rate_limit: its own rate limits, in every form ``per_key_rate_limit`` takes.
    :param reserve: slots it gets first when it has waiters, at most its concurrency.
    :param max_waiting: the most calls of it that may wait; more are refused
        (:class:`~celery_flowcontrol.FlowQueueFull`).
    :raises FlowControlConfigError: a bad value, naming the queue, the key and the field.
    :raises UnknownQueueError: for a queue nobody registered.
    """
    given = key_changes(queue, key, {"weight": weight, "concurrency": concurrency,
                                     "rate_limit": rate_limit, "reserve": reserve,
                                     "max_waiting": max_waiting})
    result = _fc(app).call_backend("set_key", name=queue, key=key, **given)
    forget_bounds(app, queue)  # this process's producers see a new bound at once
    if isinstance(result, KeyConfig):
        return result
    # Through a worker's remote control (the in-process backend), it comes back as data.
    return KeyConfig.parse(queue, key, result)


def key_changes(queue: str, key: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The fields of *fields* that are given (not ``None``), at least one of them."""
    given = {f: v for f, v in fields.items() if v is not None}
    if not given:
        raise FlowControlConfigError(f"key {key!r}: set_key needs at least one of "
                                     f"{', '.join(KEY_FIELDS)} (reset_key goes back to config)",
                                     queue, f"keys[{key!r}]")
    return given


def reset_key(app: Any, queue: str, key: str) -> None:
    """Drop every run-time override of *key* in *queue* (:func:`set_key`): its settings are
    its ``keys=`` entry's again, else the queue's per-key defaults.

    :raises UnknownQueueError: for a queue nobody registered.
    """
    _fc(app).call_backend("reset_key", name=queue, key=key)
    forget_bounds(app, queue)


def pause_until(now: float, until: Any) -> float | None:
    """The instant (epoch seconds) a pause given as *until* ends, at *now*: ``None`` (until
    resumed), a duration from now (``"10m"``, a ``timedelta``), a ``datetime`` (naive means
    UTC) or epoch seconds (a number). A past instant is a
    :class:`~celery_flowcontrol.FlowControlConfigError`."""
    if until is None:
        return None
    if isinstance(until, (str, timedelta)):
        return now + parse_duration(until, field="until")
    if isinstance(until, datetime):
        at = until.timestamp() if until.tzinfo is not None else \
            (until - datetime(1970, 1, 1)).total_seconds()
    elif isinstance(until, (int, float)) and not isinstance(until, bool) and math.isfinite(until):
        at = float(until)
    else:
        raise FlowControlConfigError(f"must be a duration from now ('10m'), a datetime or epoch "
                                     f"seconds, got {until!r}", None, "until")
    if at <= now:
        raise FlowControlConfigError(f"is in the past ({at:.0f} <= now {now:.0f}): a number is "
                                     "epoch seconds; give a duration such as '10m' for a span",
                                     None, "until")
    return at


def pause(app: Any, queue: str, key: str | None = None, until: Any = None) -> float | None:
    """Admit nothing of flow queue *queue* (or, with *key*, of that fairness key) until
    :func:`resume`, or until *until*. Running tasks finish; waiters keep their places in
    line; a slot a paused key would have been granted goes to the next waiter not paused.
    Returns the instant the pause ends (epoch seconds), or ``None`` while open-ended.

    :param app: the Celery app.
    :param queue: the flow queue's name.
    :param key: a fairness key, to pause only its calls.
    :param until: when the pause ends by itself: a duration from now (``"10m"``), a
        ``datetime`` or epoch seconds; ``None``: when resumed.
    :raises FlowControlConfigError: a bad or past *until*, or a bad key.
    :raises UnknownQueueError: for a queue nobody registered.
    """
    at = pause_end(app, queue, until)
    _fc(app).call_backend("pause", name=queue, key=key, until=at)
    return at


def pause_end(app: Any, queue: str, until: Any) -> float | None:
    """:func:`pause_until` by *app*'s clock, an error naming *queue*."""
    from .engines import engines_of

    try:
        return pause_until(engines_of(app).now(), until)
    except FlowControlConfigError as exc:
        raise FlowControlConfigError(exc.detail, queue, "until") from None


def resume(app: Any, queue: str, key: str | None = None) -> None:
    """End a pause of *queue* (or of its *key*): its waiters are admitted again in order.
    Resuming what is not paused does nothing; a key's ``FlowBackoff`` is not ended by it.
    The calls the pause parked are made due at once in the parking store: the workers' next
    poll wakes them, in a queue with no cap too (no slot is granted there).

    :raises UnknownQueueError: for a queue nobody registered.
    :raises ParkingUnavailableError: the parking store is down after the pause ended; its
        calls then wake at their re-check (the pause's end, or the queue's ``retry``), and
        calling ``resume`` again wakes them at once.
    """
    fc = _fc(app)
    fc.call_backend("resume", name=queue, key=key)
    wake_paused(fc, queue, key)


def wake_paused(fc: Any, queue: str, key: str | None) -> int:
    """Make the rows parked ``paused`` in *queue* (of *key*, if given) due now, in *fc*'s
    parking store: a grant wakes a waiter of a queue with a cap, but an uncapped queue has
    no slots to grant, and its rows would wait until the pause's end. The rows moved."""
    return PausedRows(fc.store).wake(queue, key)
