"""Flow queues: :class:`QueueConfig`, one named cap, and :func:`parse_queues` for a list of them."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..errors import FlowControlConfigError
from .fields import (
    FAIRNESS,
    MAX_CONCURRENCY,
    MAX_HOLD_LIMIT,
    NAME_RE,
    ORDERS,
    RELEASES,
    DurationLike,
    check_choice,
    check_int,
    parse_duration,
    unknown_key_detail,
)
from .key_config import (
    KEY_FIELDS,
    KeyConfig,
    KeyTable,
    check_key,
    check_key_concurrency,
    check_max_waiting,
    check_reserve,
    key_field,
    parse_keys,
)
from .rate_limits import RateLimit, RateLimitLike, RateLimits, as_tuple, parse_rate_limits, rates_to_data

#: The settings of a key without ``keys=`` entry (every field the queue's per-key default).
DEFAULT_KEY = KeyConfig()


@dataclass(frozen=True, init=False)
class QueueConfig:
    """One flow queue: a named cap on concurrency and/or rate, validated on construction.

    The constructor accepts the loose forms (``rate_limit="100/m"``, ``max_hold="2h"``) and stores
    them normalised (a :class:`RateLimit`, float seconds). ``rate_limit`` and
    ``per_key_rate_limit`` keep their shape: one limit stays one :class:`RateLimit`, a list
    becomes a tuple of them; :attr:`rate_limits` and :attr:`per_key_rate_limits` are always
    tuples, for readers that take every limit. ``dataclasses.replace`` goes through the same
    validation.
    """

    name: str
    concurrency: int | None
    rate_limit: RateLimits | None
    retry: float
    fairness: str
    order: str
    per_key_concurrency: int | None
    release: str
    max_hold: float | None
    per_key_rate_limit: RateLimits | None
    per_key_reserve: int | None
    per_key_max_waiting: int | None
    max_waiting: int | None
    keys: KeyTable

    def __init__(
        self,
        name: str,
        concurrency: int | None = None,
        rate_limit: RateLimitLike | Iterable[RateLimitLike] | None = None,
        retry: DurationLike = 1.0,
        fairness: str = "fifo",
        order: str = "fifo",
        per_key_concurrency: int | None = None,
        release: str = "on_result",
        max_hold: DurationLike | None = None,
        per_key_rate_limit: RateLimitLike | Iterable[RateLimitLike] | None = None,
        per_key_reserve: int | None = None,
        per_key_max_waiting: int | None = None,
        max_waiting: int | None = None,
        keys: Mapping[str, KeyConfig | Mapping[str, Any]] | None = None,
    ) -> None:
        queue = name if isinstance(name, str) else None
        if queue is None or not NAME_RE.fullmatch(queue):
            raise FlowControlConfigError(f"must match [a-z0-9._-]{{1,64}}, got {name!r}", queue, "name")
        if concurrency is not None:
            check_int(concurrency, name, "concurrency", 1, MAX_CONCURRENCY)
        rate = parse_rate_limits(rate_limit, name, "rate_limit")
        key_rate = parse_rate_limits(per_key_rate_limit, name, "per_key_rate_limit")
        for i, r in enumerate(as_tuple(key_rate)):
            if r.adaptive:
                where = "per_key_rate_limit" if isinstance(key_rate, RateLimit) else f"per_key_rate_limit[{i}]"
                raise FlowControlConfigError(
                    "adaptive limits are the queue's own (rate_limit): a key's windows have no live "
                    "figure to learn; use adaptive=False here", name, f"{where}.adaptive")
        retry_seconds = parse_duration(retry, queue=name, field="retry")
        check_choice(fairness, FAIRNESS, name, "fairness")
        check_choice(order, ORDERS, name, "order")
        if per_key_concurrency is not None:
            check_int(per_key_concurrency, name, "per_key_concurrency", 1, MAX_CONCURRENCY)
            if concurrency is not None and per_key_concurrency > concurrency:
                raise FlowControlConfigError(
                    f"must not exceed concurrency ({concurrency}), got {per_key_concurrency!r}",
                    name,
                    "per_key_concurrency",
                )
        check_choice(release, RELEASES, name, "release")
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
        key_cap = per_key_concurrency if per_key_concurrency is not None else concurrency
        if per_key_reserve is not None:
            check_reserve(per_key_reserve, key_cap, name, "per_key_reserve")
        if per_key_max_waiting is not None:
            check_max_waiting(per_key_max_waiting, name, "per_key_max_waiting")
        if max_waiting is not None:
            check_max_waiting(max_waiting, name, "max_waiting")
        table = parse_keys(keys, name, concurrency, per_key_concurrency)
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
            ("per_key_rate_limit", key_rate),
            ("per_key_reserve", per_key_reserve),
            ("per_key_max_waiting", per_key_max_waiting),
            ("max_waiting", max_waiting),
            ("keys", table),
        ):
            object.__setattr__(self, key, value)

    @property
    def rate_limits(self) -> tuple[RateLimit, ...]:
        """Every limit of ``rate_limit``, as a tuple (empty when there is none)."""
        return as_tuple(self.rate_limit)

    @property
    def per_key_rate_limits(self) -> tuple[RateLimit, ...]:
        """Every limit of ``per_key_rate_limit``, as a tuple (empty when there is none)."""
        return as_tuple(self.per_key_rate_limit)

    def key_config(self, key: str) -> KeyConfig:
        """The ``keys=`` entry of *key* (a :class:`KeyConfig` of defaults if it has none)."""
        return self.keys.get(key, DEFAULT_KEY)

    def key_settings(self, key: str, override: Mapping[str, Any] | None = None) -> KeyConfig:
        """*key*'s own settings: its ``keys=`` entry with a run-time *override* (the fields
        ``set_key`` set, as :meth:`key_override` returns them) on top."""
        base = self.key_config(key)
        if not override:
            return base
        return base.merged(override, queue=self.name, key=key, concurrency=self.key_cap)

    @property
    def key_cap(self) -> int | None:
        """The concurrency a key without its own has: ``per_key_concurrency``, else
        ``concurrency``."""
        return self.per_key_concurrency if self.per_key_concurrency is not None else self.concurrency

    def key_override(self, key: object, current: Mapping[str, Any],
                     changes: Mapping[str, Any]) -> dict[str, Any]:
        """The run-time override of *key* after ``set_key(**changes)`` on top of *current*
        (a field given ``None`` drops its override), normalised (a weight as a float, a rate
        limit parsed). Checked as ``keys=`` is: :class:`FlowControlConfigError` naming the
        queue, the key and the field."""
        key = check_key(self.name, key)
        for name in changes:
            if name not in KEY_FIELDS:
                where = key_field(key, name) if isinstance(name, str) else f"keys[{key!r}]"
                raise FlowControlConfigError(unknown_key_detail(name, KEY_FIELDS), self.name, where)
        new = {f: v for f, v in current.items() if f not in changes}
        new.update((f, v) for f, v in changes.items() if v is not None)
        settings = self.key_config(key).merged(new, queue=self.name, key=key,
                                               concurrency=self.key_cap)
        check_key_concurrency(settings, self.name, key, self.concurrency)
        return {f: getattr(settings, f) for f in KEY_FIELDS if f in new}

    def cost_limit(self) -> tuple[float, RateLimit | None]:
        """The largest cost one admission may have, and the limit that sets it: the least
        :attr:`RateLimit.max_charge` of the ``per="cost"`` limits (``inf, None`` without one)."""
        best: tuple[float, RateLimit | None] = (math.inf, None)
        for r in self.rate_limits + self.per_key_rate_limits:
            if r.per == "cost" and r.max_charge < best[0]:
                best = (r.max_charge, r)
        return best

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
        data["rate_limit"] = rates_to_data(self.rate_limit)
        data["per_key_rate_limit"] = rates_to_data(self.per_key_rate_limit)
        data["keys"] = self.keys.to_dict()
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


__all__ = ["DEFAULT_KEY", "QueueConfig", "parse_queues"]
