"""Per-key settings of a flow queue: :class:`KeyConfig`, one fairness key's own weight and caps.

A queue's ``keys={"acme": {"weight": 5, "concurrency": 10}}`` gives single keys their own
values; a field left out (``None``) takes the queue's per-key default (``per_key_concurrency``,
``per_key_rate_limit``, ``per_key_reserve``, ``per_key_max_waiting``; weight 1). The same
fields come from ``set_key`` at run time. Every error names the queue, the key and the field,
as ``keys['acme'].weight``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..errors import FlowControlConfigError
from .fields import MAX_CONCURRENCY, MAX_KEY_BYTES, check_int, unknown_key_detail
from .rate_limits import RateLimit, RateLimits, as_tuple, parse_rate_limits, rates_to_data

#: The bounds of a weight. A key's virtual time moves by cost / weight per admission, so the
#: range keeps those steps finite and exact enough in a double.
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1_000_000.0
#: The largest ``max_waiting`` bound (queue or key).
MAX_WAITING = 1_000_000_000
KEY_FIELDS = ("weight", "concurrency", "rate_limit", "reserve", "max_waiting")


def key_field(key: str, field: str) -> str:
    """How errors name *field* of *key*: ``keys['acme'].weight``."""
    return f"keys[{key!r}].{field}"


def check_key(queue: str | None, key: object) -> str:
    """*key* if it can be a fairness key (a str of at most 256 bytes in UTF-8)."""
    if not isinstance(key, str):
        raise FlowControlConfigError(f"a key must be a str, got {key!r}", queue, "keys")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        raise FlowControlConfigError(f"key {key!r} must be valid Unicode text (no lone "
                                     "surrogates)", queue, "keys") from None
    if size > MAX_KEY_BYTES:
        raise FlowControlConfigError(
            f"a key must be at most {MAX_KEY_BYTES} bytes in UTF-8, got {size} "
            f"({key[:40]!r}...)", queue, "keys")
    return key


def check_weight(value: object, queue: str | None, field: str) -> float:
    """*value* as a float weight, else :class:`FlowControlConfigError`."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        weight = float(value)
        if math.isfinite(weight) and MIN_WEIGHT <= weight <= MAX_WEIGHT:
            return weight
    raise FlowControlConfigError(
        f"must be a number > 0 (between {MIN_WEIGHT:g} and {MAX_WEIGHT:g}), got {value!r}",
        queue, field)


def check_max_waiting(value: object, queue: str | None, field: str) -> int:
    return check_int(value, queue, field, 1, MAX_WAITING)


def check_reserve(value: object, cap: int | None, queue: str | None, field: str) -> int:
    """*value* as a reserve: an int >= 0, at most *cap* (the concurrency it borrows from)."""
    reserve = check_int(value, queue, field, 0, MAX_CONCURRENCY)
    if cap is not None and reserve > cap:
        raise FlowControlConfigError(
            f"must not exceed the key's concurrency ({cap}), got {reserve}", queue, field)
    return reserve


@dataclass(frozen=True)
class KeyConfig:
    """One fairness key's own settings; ``None`` takes the queue's per-key default."""

    weight: float = 1.0
    concurrency: int | None = None
    rate_limit: RateLimits | None = None
    reserve: int | None = None
    max_waiting: int | None = None

    @classmethod
    def parse(cls, queue: str | None, key: object, mapping: object, *,
              concurrency: int | None = None) -> KeyConfig:
        """A KeyConfig from a dict of its fields (or a KeyConfig), checked for *key* of
        *queue*. *concurrency* is the cap a reserve may not exceed when the key has no
        concurrency of its own (the queue's ``per_key_concurrency``, else ``concurrency``)."""
        key = check_key(queue, key)
        if isinstance(mapping, KeyConfig):
            mapping = mapping.to_dict()
        if not isinstance(mapping, Mapping):
            raise FlowControlConfigError(
                f"must be a dict of {', '.join(KEY_FIELDS)}, got {mapping!r}", queue,
                f"keys[{key!r}]")
        for name in mapping:
            if name not in KEY_FIELDS:
                where = key_field(key, name) if isinstance(name, str) else f"keys[{key!r}]"
                raise FlowControlConfigError(unknown_key_detail(name, KEY_FIELDS), queue, where)
        return cls()._with(queue, key, mapping, concurrency)

    def merged(self, changes: Mapping[str, Any], *, queue: str | None = None, key: str = "",
               concurrency: int | None = None) -> KeyConfig:
        """This config with *changes* (fields as :meth:`parse` takes them; ``None`` leaves a
        field as it is), checked as :meth:`parse` checks."""
        for name in changes:
            if name not in KEY_FIELDS:
                where = key_field(key, name) if isinstance(name, str) else f"keys[{key!r}]"
                raise FlowControlConfigError(unknown_key_detail(name, KEY_FIELDS), queue, where)
        return self._with(queue, key, changes, concurrency)

    def _with(self, queue: str | None, key: str, changes: Mapping[str, Any],
              concurrency: int | None) -> KeyConfig:
        values: dict[str, Any] = {}
        if changes.get("weight") is not None:
            values["weight"] = check_weight(changes["weight"], queue, key_field(key, "weight"))
        if changes.get("concurrency") is not None:
            values["concurrency"] = check_int(changes["concurrency"], queue,
                                              key_field(key, "concurrency"), 1, MAX_CONCURRENCY)
        if changes.get("rate_limit") is not None:
            values["rate_limit"] = key_rate_limit(changes["rate_limit"], queue, key)
        if changes.get("max_waiting") is not None:
            values["max_waiting"] = check_max_waiting(changes["max_waiting"], queue,
                                                      key_field(key, "max_waiting"))
        config = replace(self, **values) if values else self
        if changes.get("reserve") is not None:
            cap = config.concurrency if config.concurrency is not None else concurrency
            config = replace(config, reserve=check_reserve(
                changes["reserve"], cap, queue, key_field(key, "reserve")))
        elif config.reserve is not None and config.concurrency is not None:
            check_reserve(config.reserve, config.concurrency, queue, key_field(key, "reserve"))
        return config

    @property
    def rate_limits(self) -> tuple[RateLimit, ...]:
        return as_tuple(self.rate_limit)

    def to_dict(self) -> dict[str, Any]:
        """The fields set (a weight other than 1 and every field not ``None``), as plain
        data that :meth:`parse` takes back."""
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "weight":
                if value != 1.0:
                    data["weight"] = value
            elif value is not None:
                data[f.name] = rates_to_data(value) if f.name == "rate_limit" else value
        return data


def key_rate_limit(value: object, queue: str | None, key: str) -> RateLimits | None:
    """A key's own rate limit(s), in the forms ``per_key_rate_limit`` takes (no adaptive)."""
    field = key_field(key, "rate_limit")
    rate = parse_rate_limits(value, queue, field)
    for i, r in enumerate(as_tuple(rate)):
        if r.adaptive:
            where = field if isinstance(rate, RateLimit) else f"{field}[{i}]"
            raise FlowControlConfigError(
                "adaptive limits are the queue's own (rate_limit): a key's windows have no "
                "live figure to learn; use adaptive=False here", queue, f"{where}.adaptive")
    return rate


class KeyTable(Mapping[str, KeyConfig]):
    """A queue's ``keys``: an immutable, hashable mapping of key to :class:`KeyConfig`."""

    __slots__ = ("_data", "_hash")

    def __init__(self, data: Mapping[str, KeyConfig] | None = None) -> None:
        self._data: dict[str, KeyConfig] = dict(data or {})
        self._hash: int | None = None

    def __getitem__(self, key: str) -> KeyConfig:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self._data.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._data == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self._data)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {key: value.to_dict() for key, value in self._data.items()}


def parse_keys(value: object, queue: str | None, concurrency: int | None,
               per_key_concurrency: int | None) -> KeyTable:
    """A queue's ``keys=``: a dict of key to a dict of :data:`KEY_FIELDS` (or a KeyConfig).
    A key's concurrency may not exceed the queue's *concurrency*, nor its reserve its own
    concurrency (else *per_key_concurrency*, else *concurrency*)."""
    if value is None:
        return KeyTable()
    if not isinstance(value, Mapping):
        raise FlowControlConfigError(
            f"must be a dict of fairness key to a dict of {', '.join(KEY_FIELDS)}, got {value!r}",
            queue, "keys")
    cap = per_key_concurrency if per_key_concurrency is not None else concurrency
    table: dict[str, KeyConfig] = {}
    for key, entry in value.items():
        config = KeyConfig.parse(queue, key, entry, concurrency=cap)
        check_key_concurrency(config, queue, key, concurrency)
        table[key] = config
    return KeyTable(table)


def check_key_concurrency(config: KeyConfig, queue: str | None, key: str,
                          concurrency: int | None) -> None:
    """A key's own concurrency may not exceed its queue's."""
    if concurrency is not None and config.concurrency is not None and (
            config.concurrency > concurrency):
        raise FlowControlConfigError(
            f"must not exceed the queue's concurrency ({concurrency}), got {config.concurrency}",
            queue, key_field(key, "concurrency"))


__all__ = ["KEY_FIELDS", "MAX_WAITING", "MAX_WEIGHT", "MIN_WEIGHT", "KeyConfig", "KeyTable",
           "check_key", "check_key_concurrency", "check_max_waiting", "check_reserve",
           "check_weight", "key_field", "key_rate_limit", "parse_keys"]
