"""Why new waiters were denied, told from a queue's figures (the metrics' ``flowcontrol_denied_total``).

The backends keep no count of denials by reason: the sampler sees new waiters in line and
tells their reason from what holds the queue at the sample: a pause or a backoff in force, a
spent rate limit, every slot taken; with slots free only a key's own limits can deny, so each new waiter
is told by its own key: at its cap (``key-concurrency``), else held by its key's rate windows
(``key-rate``) where the queue has them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..reasons import Reason
from .queues import QueueRow

__all__ = ["denial_reasons"]


def denial_reasons(row: QueueRow, config: Any, slots: list[Any], fresh: list[Any],
                   new: int) -> dict[str, int]:
    """The *new* first denials of queue *row* by reason; *fresh* are those of them still
    in line, each told by its own key's figures."""
    if row.paused or row.backoff_until is not None:  # a pause (of the queue) first
        return {(Reason.PAUSED if row.paused else Reason.BACKOFF).value: new}
    if any(r.used >= (r.count if r.live is None else r.live) for r in row.rates):
        return {Reason.RATE.value: new}
    if row.capacity is not None and row.in_use + row.granted >= row.capacity:
        return {Reason.CONCURRENCY.value: new}
    # Slots are free: the waiter's key holds it, by its cap or by its own rate windows.
    cap = getattr(config, "per_key_concurrency", None)
    keyed_rates = bool(getattr(config, "per_key_rate_limits", None))
    busy = Counter(s.fairness_key for s in slots)
    out: Counter[str] = Counter()
    for w in fresh:
        capped = cap is not None and busy[w.fairness_key] >= cap
        held = Reason.KEY_RATE if keyed_rates and not capped else Reason.KEY_CONCURRENCY
        out[held.value] += 1
    rest = new - len(fresh)  # came and went between samples: the likelier of the two
    if rest > 0:
        likely = Reason.KEY_RATE if keyed_rates and cap is None else Reason.KEY_CONCURRENCY
        out[likely.value] += rest
    return dict(out)
