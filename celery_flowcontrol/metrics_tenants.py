"""The tenant metrics of flow queues: pauses, refusals, and per-key series of keys with their
own settings (part of :class:`~celery_flowcontrol.metrics.FlowControlCollector`'s scrape).

* ``flowcontrol_paused{queue}``: 1 while the whole queue is paused (``pause``), else 0;
  ``flowcontrol_paused_until{queue}``: when a timed pause ends (epoch seconds).
* ``flowcontrol_refused_total{queue}``: calls refused with ``FlowQueueFull`` for a full
  waiting bound (``max_waiting``), as the backend counts them, fleet-wide.
* ``flowcontrol_key_busy``, ``_key_waiting``, ``_key_weight``, ``_key_paused``,
  ``_key_admitted_recent`` (admissions in the last minute), per ``queue`` and ``key``: only for
  keys with their own settings (``keys=`` or ``set_key``) or a pause, among the
  :data:`KEY_SERIES` busiest keys of each ``fairness="key"`` queue. Cardinality stays bounded by
  what operators configure, never by how many tenants call (a key per customer would make
  one series each): a plain key has no series of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from .errors import FlowControlError
from .views.queues import QueueRow
from .views.tenant_rows import KeyRow, key_rows

__all__ = ["KEY_SERIES", "tenant_families"]

#: How many of a queue's busiest keys are looked at for per-key series at each scrape.
KEY_SERIES = 100

_KEY_GAUGES = (
    ("busy", "Slots a key with its own settings holds now."),
    ("waiting", "Calls of a key with its own settings waiting now."),
    ("weight", "The weight of a key with its own settings."),
    ("paused", "1 while a key with its own settings is paused."),
    ("admitted_recent", "Admissions of a key with its own settings in the last minute."),
)


def _keyed(fc: Any, name: str) -> list[KeyRow]:
    config = fc.config_of(name)
    if config is None or config.fairness != "key":
        return []
    try:
        return [r for r in key_rows(fc, name, KEY_SERIES) if r.overridden or r.paused_until]
    except FlowControlError:
        return []  # dropped meanwhile, or the backend hiccupped: the next scrape has it


def tenant_families(fc: Any, rows: list[QueueRow], gauge: Any, counter: Any) -> Iterator[Any]:
    """The families above for *rows* (*gauge*, *counter*: prometheus_client's metric
    family classes)."""
    paused = gauge("flowcontrol_paused", "1 while the queue is paused (pause), else 0.",
                   labels=["queue"])
    until = gauge("flowcontrol_paused_until", "When a timed pause of the queue ends (epoch "
                  "seconds).", labels=["queue"])
    refused = counter("flowcontrol_refused", "Calls refused with FlowQueueFull (a full "
                      "max_waiting bound).", labels=["queue"])
    keyed = {attr: gauge(f"flowcontrol_key_{attr}", doc, labels=["queue", "key"])
             for attr, doc in _KEY_GAUGES}
    for r in rows:
        paused.add_metric([r.name], 1.0 if r.paused else 0.0)
        if r.paused_until is not None and not math.isinf(r.paused_until):
            until.add_metric([r.name], r.paused_until)
        refused.add_metric([r.name], r.refused)
        for k in _keyed(fc, r.name):
            values = {"busy": k.busy, "waiting": k.waiting, "weight": k.weight,
                      "paused": 1 if k.paused_until else 0,
                      "admitted_recent": k.admitted_recent}
            for attr, family in keyed.items():
                family.add_metric([r.name, k.key], float(values[attr]))
    yield from (paused, until, refused, *keyed.values())
