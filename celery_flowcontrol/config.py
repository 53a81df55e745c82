"""Flow queue configuration: :class:`QueueConfig`, :class:`RateLimit` and durations.

Everything here is plain data, validated when it is built, so a bad config fails at boot with a
:class:`~celery_flowcontrol.errors.FlowControlConfigError` naming the queue and the field, never
later inside a backend. Accepted forms:

- durations: seconds (int/float > 0), ``timedelta``, or strings ``"250ms"``, ``"90s"``, ``"45m"``,
  ``"2h"``, ``"1.5h"``, ``"1d"``, ``"30"`` (a bare number is seconds);
- rate limits: a :class:`RateLimit`, a dict ``{"limit", "period", "algorithm", "burst"}`` (``period``
  any duration), or Celery-style ``"100/m"``, ``"10/s"``, ``"1000/h"``, ``"5/d"``, with a count in
  the period too: ``"20/2s"`` is 20 per 2 seconds, ``"20/90s"`` 20 per 90 seconds.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from celery_flowcontrol.errors import FlowControlConfigError

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_HOLD_LIMIT",
    "MAX_KEY_BYTES",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "QueueConfig",
    "RateLimit",
    "parse_duration",
    "parse_queues",
]

MAX_CONCURRENCY = 100_000
MAX_HOLD_LIMIT = 30 * 86_400.0  # 30 days, in seconds
MAX_KEY_BYTES = 256  # longest fairness key, UTF-8 encoded
PRIORITY_MIN = -1_000_000
PRIORITY_MAX = 1_000_000

ALGORITHMS = ("fixed", "sliding", "gcra")
FAIRNESS = ("fifo", "key")
ORDERS = ("fifo", "lifo")
RELEASES = ("on_result", "manual")

DurationLike = float | str | timedelta

# The name goes into Redis keys inside a hash tag ("fc:{name}:..."), so braces, colons and
# anything a shell or URL would mangle are out.
NAME_RE = re.compile(r"[a-z0-9._-]{1,64}")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_DURATION_RE = re.compile(rf"({_NUMBER})(ms|s|m|h|d)?")
_RATE_RE = re.compile(rf"(\d+)/({_NUMBER})?(ms|s|m|h|d)")
_DURATION_FORMS = "seconds > 0 or a string like '90s', '45m', '2h', '1d', '250ms'"
_RATE_FORMS = "a RateLimit, a dict with 'limit' and 'period', or a string like '100/m', '10/s', '20/2s'"


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


def _check_int(value: object, queue: str | None, field: str, low: int, high: int | None = None) -> int:
    """Return *value* if it is an int (never a bool or float) within [low, high]."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= low and (high is None or value <= high):
            return value
    allowed = f"an int >= {low}" if high is None else f"an int between {low} and {high}"
    raise FlowControlConfigError(f"must be {allowed}, got {value!r}", queue, field)


def _check_choice(value: object, choices: tuple[str, ...], queue: str | None, field: str) -> str:
    """Return *value* if it is one of *choices*."""
    if isinstance(value, str) and value in choices:
        return value
    allowed = ", ".join(repr(choice) for choice in choices)
    raise FlowControlConfigError(f"must be one of {allowed}, got {value!r}", queue, field)


@dataclass(frozen=True, init=False)
class RateLimit:
    """At most ``limit`` admissions per ``period`` seconds, counted by ``algorithm``.

    ``fixed`` counts per window aligned to the period, ``sliding`` never admits more than ``limit``
    in any trailing period, ``gcra`` spaces admissions ``period / limit`` apart and lets ``burst``
    of them through back to back. ``burst`` is GCRA's only: for the window algorithms the limit
    itself is the burst, so any other value than 1 there is rejected rather than ignored.
    """

    limit: int
    period: float
    algorithm: str
    burst: int

    def __init__(self, limit: int, period: DurationLike, algorithm: str = "fixed", burst: int = 1) -> None:
        # A RateLimit does not know its queue: errors here have queue=None and parse() adds it.
        values = {
            "limit": _check_int(limit, None, "rate_limit.limit", 1),
            "period": parse_duration(period, field="rate_limit.period"),
            "algorithm": _check_choice(algorithm, ALGORITHMS, None, "rate_limit.algorithm"),
            "burst": _check_int(burst, None, "rate_limit.burst", 1),
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)
        if self.burst != 1 and self.algorithm != "gcra":
            raise FlowControlConfigError(
                f"burst is only for algorithm 'gcra' (got algorithm {self.algorithm!r}, where the limit "
                f"is the burst); leave burst at 1 or use 'gcra', got burst={self.burst!r}",
                None,
                "rate_limit.burst",
            )

    @classmethod
    def parse(cls, value: object, queue: str | None = None) -> RateLimit:
        """Build a RateLimit from any accepted form (see the module docstring); errors name *queue*."""
        if isinstance(value, RateLimit):
            return value
        if isinstance(value, str):
            match = _RATE_RE.fullmatch(value.strip())
            if not match:
                raise FlowControlConfigError(f"must be {_RATE_FORMS}, got {value!r}", queue, "rate_limit")
            # "100/m" is 100 per 1m; "20/2s" is 20 per 2s
            kwargs: dict[str, Any] = {"limit": int(match[1]), "period": (match[2] or "1") + match[3]}
        elif isinstance(value, Mapping):
            allowed = [f.name for f in fields(cls)]
            for key in value:
                if key not in allowed:
                    field = f"rate_limit.{key}" if isinstance(key, str) else "rate_limit"
                    raise FlowControlConfigError(unknown_key_detail(key, allowed), queue, field)
            for key in ("limit", "period"):
                if key not in value:
                    detail = f"is required, got {dict(value)!r}"
                    raise FlowControlConfigError(detail, queue, f"rate_limit.{key}")
            kwargs = dict(value)
        else:
            raise FlowControlConfigError(f"must be {_RATE_FORMS}, got {value!r}", queue, "rate_limit")
        try:
            return cls(**kwargs)
        except FlowControlConfigError as err:
            raise FlowControlConfigError(err.detail, queue, err.field) from None

    def to_dict(self) -> dict[str, Any]:
        """The plain-data form, accepted back by :meth:`parse`."""
        return {"limit": self.limit, "period": self.period, "algorithm": self.algorithm, "burst": self.burst}


@dataclass(frozen=True, init=False)
class QueueConfig:
    """One flow queue: a named cap on concurrency and/or rate, validated on construction.

    The constructor accepts the loose forms (``rate_limit="100/m"``, ``max_hold="2h"``) and stores
    them normalised (a :class:`RateLimit`, float seconds), so readers see one type per field.
    ``dataclasses.replace`` goes through the same validation.
    """

    name: str
    concurrency: int | None
    rate_limit: RateLimit | None
    retry: float
    fairness: str
    order: str
    per_key_concurrency: int | None
    release: str
    max_hold: float | None

    def __init__(
        self,
        name: str,
        concurrency: int | None = None,
        rate_limit: RateLimit | str | Mapping[str, Any] | None = None,
        retry: DurationLike = 1.0,
        fairness: str = "fifo",
        order: str = "fifo",
        per_key_concurrency: int | None = None,
        release: str = "on_result",
        max_hold: DurationLike | None = None,
    ) -> None:
        queue = name if isinstance(name, str) else None
        if queue is None or not NAME_RE.fullmatch(queue):
            raise FlowControlConfigError(f"must match [a-z0-9._-]{{1,64}}, got {name!r}", queue, "name")
        if concurrency is not None:
            _check_int(concurrency, name, "concurrency", 1, MAX_CONCURRENCY)
        rate = None if rate_limit is None else RateLimit.parse(rate_limit, queue=name)
        retry_seconds = parse_duration(retry, queue=name, field="retry")
        _check_choice(fairness, FAIRNESS, name, "fairness")
        _check_choice(order, ORDERS, name, "order")
        if per_key_concurrency is not None:
            _check_int(per_key_concurrency, name, "per_key_concurrency", 1, MAX_CONCURRENCY)
            if concurrency is not None and per_key_concurrency > concurrency:
                raise FlowControlConfigError(
                    f"must not exceed concurrency ({concurrency}), got {per_key_concurrency!r}",
                    name,
                    "per_key_concurrency",
                )
        _check_choice(release, RELEASES, name, "release")
        hold = None if max_hold is None else parse_duration(max_hold, queue=name, field="max_hold")
        if hold is not None and hold > MAX_HOLD_LIMIT:
            raise FlowControlConfigError(
                f"must be at most 30 days ({MAX_HOLD_LIMIT:.0f} s), got {max_hold!r}", name, "max_hold"
            )
        if hold is None and release == "manual":
            # A manual slot whose task never calls release_slot() would otherwise be held forever.
            raise FlowControlConfigError(
                "is required when release='manual' (e.g. max_hold='2h'), got None", name, "max_hold"
            )
        for key, value in (
            ("name", name),
            ("concurrency", concurrency),
            ("rate_limit", rate),
            ("retry", retry_seconds),
            ("fairness", fairness),
            ("order", order),
            ("per_key_concurrency", per_key_concurrency),
            ("release", release),
            ("max_hold", hold),
        ):
            object.__setattr__(self, key, value)

    @classmethod
    def from_value(cls, value: object) -> QueueConfig:
        """Return *value* if it is a QueueConfig, else build one from a dict of its fields."""
        if isinstance(value, QueueConfig):
            return value
        if not isinstance(value, Mapping):
            raise FlowControlConfigError(
                f"a flow queue config must be a QueueConfig or a dict, got {value!r}", None, "config"
            )
        name = value.get("name")
        queue = name if isinstance(name, str) else None
        allowed = [f.name for f in fields(cls)]
        for key in value:
            if key not in allowed:
                field = key if isinstance(key, str) else repr(key)
                raise FlowControlConfigError(unknown_key_detail(key, allowed), queue, field)
        if "name" not in value:
            raise FlowControlConfigError(f"is required, got {dict(value)!r}", None, "name")
        return cls(**value)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-safe) with every field; ``QueueConfig.from_value(c.to_dict()) == c``."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["rate_limit"] = None if self.rate_limit is None else self.rate_limit.to_dict()
        return data


def parse_queues(values: object, *, field: str = "flowcontrol_queues") -> dict[str, QueueConfig]:
    """Build ``{name: QueueConfig}``, in the given order, from a list of QueueConfig or dicts.

    ``None`` gives no queues. Two entries with one name are an error (``field="name"``): at boot
    that is a typo, not a replacement (use ``register_queue`` to replace a queue at run time).
    """
    if values is None:
        return {}
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise FlowControlConfigError(f"must be a list of QueueConfig or dicts, got {values!r}", None, field)
    queues: dict[str, QueueConfig] = {}
    positions: dict[str, int] = {}
    for index, value in enumerate(values):
        if not isinstance(value, (QueueConfig, Mapping)):
            raise FlowControlConfigError(
                f"each entry must be a QueueConfig or a dict, got {value!r}", None, f"{field}[{index}]"
            )
        config = QueueConfig.from_value(value)
        if config.name in queues:
            raise FlowControlConfigError(
                f"entries {positions[config.name]} and {index} of {field} share this name; "
                "names must be unique",
                config.name,
                "name",
            )
        queues[config.name] = config
        positions[config.name] = index
    return queues
