"""Flow queue configuration: :class:`QueueConfig`, :class:`RateLimit` and durations.

Everything here is plain data, validated when it is built, so a bad config fails at boot with a
:class:`~celery_flowcontrol.errors.FlowControlConfigError` naming the queue and the field, never
later inside a backend. Accepted forms:

- durations: seconds (int/float > 0), ``timedelta``, or strings ``"250ms"``, ``"90s"``, ``"45m"``,
  ``"2h"``, ``"1.5h"``, ``"1d"``, ``"30"`` (a bare number is seconds);
- rate limits: a :class:`RateLimit`, a dict ``{"limit", "period", "algorithm", "burst", "per",
  "adaptive"}`` (``period`` any duration), or Celery-style ``"100/m"``, ``"10/s"``, ``"1000/h"``,
  ``"5/d"``, with a count in the period too: ``"20/2s"`` is 20 per 2 seconds, ``"20/90s"`` 20 per
  90 seconds; ``rate_limit`` and ``per_key_rate_limit`` take one of these or a list of them
  (every limit of the list must admit a task before it runs).
"""

from __future__ import annotations

from .fields import (
    MAX_CONCURRENCY,
    MAX_HOLD_LIMIT,
    MAX_KEY_BYTES,
    MAX_RATE_LIMITS,
    NAME_RE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    parse_duration,
    unknown_key_detail,
)
from .key_config import KeyConfig, KeyTable
from .queue import DEFAULT_KEY, QueueConfig, parse_queues
from .rate_limits import RateLimit, as_tuple, parse_rate_limits

__all__ = [
    "DEFAULT_KEY",
    "KeyConfig",
    "KeyTable",
    "MAX_CONCURRENCY",
    "MAX_HOLD_LIMIT",
    "MAX_KEY_BYTES",
    "MAX_RATE_LIMITS",
    "NAME_RE",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "QueueConfig",
    "RateLimit",
    "as_tuple",
    "parse_duration",
    "parse_queues",
    "parse_rate_limits",
    "unknown_key_detail",
]
