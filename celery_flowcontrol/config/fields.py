"""The building blocks of flow queue configuration: bounds, choices, durations, field checks.

Shared by :mod:`.rate_limits` (:class:`RateLimit`) and :mod:`.queue` (:class:`QueueConfig`); every
check raises :class:`~celery_flowcontrol.errors.FlowControlConfigError` naming the queue and
the field.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from datetime import timedelta

from ..errors import FlowControlConfigError

MAX_CONCURRENCY = 100_000
MAX_HOLD_LIMIT = 30 * 86_400.0  # 30 days, in seconds
MAX_KEY_BYTES = 256  # longest fairness key, UTF-8 encoded
PRIORITY_MIN = -1_000_000
PRIORITY_MAX = 1_000_000

ALGORITHMS = ("fixed", "sliding", "gcra")
FAIRNESS = ("fifo", "key")
ORDERS = ("fifo", "lifo")
RELEASES = ("on_result", "manual")
PERS = ("call", "cost")
#: The most limits one ``rate_limit`` (or ``per_key_rate_limit``) list may hold: each is read
#: by every decision of the queue, so their number bounds a decision's cost.
MAX_RATE_LIMITS = 8

DurationLike = float | str | timedelta

# The name goes into Redis keys inside a hash tag ("fc:{name}:..."), so braces, colons and
# anything a shell or URL would mangle are out.
NAME_RE = re.compile(r"[a-z0-9._-]{1,64}")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION_RE = re.compile(rf"({NUMBER})(ms|s|m|h|d)?")
RATE_RE = re.compile(rf"(\d+)/({NUMBER})?(ms|s|m|h|d)")
_DURATION_FORMS = "seconds > 0 or a string like '90s', '45m', '2h', '1d', '250ms'"
RATE_FORMS = "a RateLimit, a dict with 'limit' and 'period', or a string like '100/m', '10/s', '20/2s'"
RATES_FORMS = f"{RATE_FORMS}, or a list of those"


def unknown_key_detail(key: object, allowed: Iterable[str]) -> str:
    """Message for a key that is not allowed, with the closest allowed key as a hint."""
    allowed = list(allowed)
    close = difflib.get_close_matches(key, allowed, n=1) if isinstance(key, str) else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key {key!r}; {hint}allowed keys: {', '.join(allowed)}"


def parse_duration(
    value: object, *, queue: str | None = None, field: str = "duration", allow_zero: bool = False
) -> float:
    """Return *value* as float seconds, or raise FlowControlConfigError naming *queue* and *field*.

    Accepts int/float seconds, ``timedelta``, numeric strings and ``"<number><unit>"`` strings with
    unit ``ms``, ``s``, ``m``, ``h`` or ``d`` (``"1.5h"``). Zero only with *allow_zero*; never bools,
    negatives, NaN or infinity.
    """
    seconds: float | None = None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = None
    elif isinstance(value, str):
        match = _DURATION_RE.fullmatch(value.strip())
        if match:
            seconds = float(match[1]) * _UNITS[match[2] or "s"]
    if seconds is None or not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        allowed = _DURATION_FORMS.replace("> 0", ">= 0") if allow_zero else _DURATION_FORMS
        raise FlowControlConfigError(f"must be a duration: {allowed}, got {value!r}", queue, field)
    return seconds


def check_int(value: object, queue: str | None, field: str, low: int, high: int | None = None) -> int:
    """Return *value* if it is an int (never a bool or float) within [low, high]."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= low and (high is None or value <= high):
            return value
    allowed = f"an int >= {low}" if high is None else f"an int between {low} and {high}"
    raise FlowControlConfigError(f"must be {allowed}, got {value!r}", queue, field)


def check_choice(value: object, choices: tuple[str, ...], queue: str | None, field: str) -> str:
    """Return *value* if it is one of *choices*."""
    if isinstance(value, str) and value in choices:
        return value
    allowed = ", ".join(repr(choice) for choice in choices)
    raise FlowControlConfigError(f"must be one of {allowed}, got {value!r}", queue, field)


