"""Rate limits: :class:`RateLimit`, and ``rate_limit`` values of one limit or a list of them.

A queue's ``rate_limit`` (and ``per_key_rate_limit``) keeps the shape it was given: one limit
stays one :class:`RateLimit`, a list becomes a tuple; :func:`as_tuple` gives every limit either
way. Errors name the queue and the entry (``rate_limit[2].period``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..errors import FlowControlConfigError
from .fields import (
    ALGORITHMS,
    MAX_RATE_LIMITS,
    PERS,
    RATE_FORMS,
    RATE_RE,
    RATES_FORMS,
    DurationLike,
    check_choice,
    check_int,
    parse_duration,
    unknown_key_detail,
)


@dataclass(frozen=True, init=False)
class RateLimit:
    """At most ``limit`` admissions (or units of cost) per ``period`` seconds, counted by ``algorithm``.

    ``fixed`` counts per window aligned to the period, ``sliding`` never admits more than ``limit``
    in any trailing period, ``gcra`` spaces admissions ``period / limit`` apart and lets ``burst``
    of them through back to back. ``burst`` is GCRA's only: for the window algorithms the limit
    itself is the burst, so any other value than 1 there is rejected rather than ignored.

    ``per="call"`` (the default) counts each admission as 1; ``per="cost"`` counts its cost
    (``flow_cost``, default 1), such as the tokens of an LLM call, and :func:`settle_cost`
    corrects the charge once the true figure is known. ``adaptive=True`` makes ``limit`` a
    ceiling: each backoff halves the live limit, each period without one adds a tenth of the
    ceiling back (AIMD).
    """

    limit: int
    period: float
    algorithm: str
    burst: int
    per: str
    adaptive: bool

    def __init__(self, limit: int, period: DurationLike, algorithm: str = "fixed", burst: int = 1,
                 per: str = "call", adaptive: bool = False) -> None:
        # A RateLimit does not know its queue: errors here have queue=None and parse() adds it.
        if not isinstance(adaptive, bool):
            raise FlowControlConfigError(f"must be True or False, got {adaptive!r}", None,
                                         "rate_limit.adaptive")
        values = {
            "limit": check_int(limit, None, "rate_limit.limit", 1),
            "period": parse_duration(period, field="rate_limit.period"),
            "algorithm": check_choice(algorithm, ALGORITHMS, None, "rate_limit.algorithm"),
            "burst": check_int(burst, None, "rate_limit.burst", 1),
            "per": check_choice(per, PERS, None, "rate_limit.per"),
            "adaptive": adaptive,
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

    @property
    def max_charge(self) -> int:
        """The largest charge one admission may make here: a cost above it is never admitted
        (``burst`` for GCRA, else ``limit``)."""
        return self.burst if self.algorithm == "gcra" else self.limit

    def describe(self) -> str:
        """Short text for errors and operators, e.g. ``200000 per 60 s (per cost, fixed)``."""
        extra = [f"per {self.per}", self.algorithm]
        if self.algorithm == "gcra":
            extra.append(f"burst {self.burst}")
        if self.adaptive:
            extra.append("adaptive")
        return f"{self.limit} per {self.period:g} s ({', '.join(extra)})"

    @classmethod
    def parse(cls, value: object, queue: str | None = None, field: str = "rate_limit") -> RateLimit:
        """Build a RateLimit from any accepted form (see the module docstring); errors name
        *queue* and *field* (``"rate_limit"``, or ``"rate_limit[1]"`` for a list's entry)."""
        if isinstance(value, RateLimit):
            return value
        if isinstance(value, str):
            match = RATE_RE.fullmatch(value.strip())
            if not match:
                raise FlowControlConfigError(f"must be {RATE_FORMS}, got {value!r}", queue, field)
            # "100/m" is 100 per 1m; "20/2s" is 20 per 2s
            kwargs: dict[str, Any] = {"limit": int(match[1]), "period": (match[2] or "1") + match[3]}
        elif isinstance(value, Mapping):
            allowed = [f.name for f in fields(cls)]
            for key in value:
                if key not in allowed:
                    where = f"{field}.{key}" if isinstance(key, str) else field
                    raise FlowControlConfigError(unknown_key_detail(key, allowed), queue, where)
            for key in ("limit", "period"):
                if key not in value:
                    detail = f"is required, got {dict(value)!r}"
                    raise FlowControlConfigError(detail, queue, f"{field}.{key}")
            kwargs = dict(value)
        else:
            raise FlowControlConfigError(f"must be {RATE_FORMS}, got {value!r}", queue, field)
        try:
            return cls(**kwargs)
        except FlowControlConfigError as err:
            where = err.field or field
            if where.startswith("rate_limit"):
                where = field + where[len("rate_limit"):]
            raise FlowControlConfigError(err.detail, queue, where) from None

    def to_dict(self) -> dict[str, Any]:
        """The plain-data form, accepted back by :meth:`parse`."""
        return {"limit": self.limit, "period": self.period, "algorithm": self.algorithm,
                "burst": self.burst, "per": self.per, "adaptive": self.adaptive}


RateLimits = RateLimit | tuple[RateLimit, ...]
RateLimitLike = RateLimit | str | Mapping[str, Any]


def parse_rate_limits(value: object, queue: str | None, field: str) -> RateLimits | None:
    """One limit (kept as one :class:`RateLimit`) or a list of them (kept as a tuple), from the
    forms the module docstring lists; ``None`` for none. Errors name *queue* and the entry
    (``"rate_limit[2].period"``). A list must hold 1 to :data:`MAX_RATE_LIMITS` distinct limits."""
    if value is None:
        return None
    if isinstance(value, (str, Mapping, RateLimit)):
        return RateLimit.parse(value, queue=queue, field=field)
    if not isinstance(value, (list, tuple)):
        raise FlowControlConfigError(f"must be {RATES_FORMS}, got {value!r}", queue, field)
    if not 1 <= len(value) <= MAX_RATE_LIMITS:
        raise FlowControlConfigError(
            f"a list must hold 1 to {MAX_RATE_LIMITS} limits (None for no limit), got {len(value)}",
            queue, field)
    rates = tuple(RateLimit.parse(v, queue=queue, field=f"{field}[{i}]") for i, v in enumerate(value))
    for i, rate in enumerate(rates):
        if rate in rates[:i]:
            raise FlowControlConfigError(
                f"entries {rates.index(rate)} and {i} are the same limit ({rate.describe()}); "
                "list each limit once", queue, f"{field}[{i}]")
    return rates


def as_tuple(rates: RateLimits | None) -> tuple[RateLimit, ...]:
    """Every limit of a ``rate_limit`` value, as a tuple (empty for ``None``)."""
    if rates is None:
        return ()
    return (rates,) if isinstance(rates, RateLimit) else rates


def rates_to_data(rates: RateLimits | None) -> Any:
    if rates is None:
        return None
    if isinstance(rates, RateLimit):
        return rates.to_dict()
    return [r.to_dict() for r in rates]


__all__ = ["RateLimit", "RateLimitLike", "RateLimits", "as_tuple", "parse_rate_limits",
           "rates_to_data"]
