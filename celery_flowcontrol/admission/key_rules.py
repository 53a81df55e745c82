"""The settings in force for each fairness key of one queue: its ``keys=`` entry, the run-time
overrides ``set_key`` made on top, and the queue's per-key defaults for what neither sets.

:class:`KeyRules` is what a decision reads of a key (resolved once per key and cached: a key
without settings of its own shares one default, so 100,000 keys cost nothing until they have
some). The Redis twin stores the same resolved figures per key in one hash (``keyset``),
read only for the keys a decision touches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import DEFAULT_KEY, KeyConfig, QueueConfig, RateLimit, as_tuple
from ..config.key_config import KEY_FIELDS, key_field


@dataclass(frozen=True)
class KeyRules:
    """One key's settings in force. *concurrency* is its own, else ``per_key_concurrency``;
    *rates* its own limits, else ``per_key_rate_limit``'s; *reserve* its own, else
    ``per_key_reserve``, else 0; *max_waiting* its own, else ``per_key_max_waiting``, and
    *bound_field* the field that sets it; *own* true if ``keys=`` or ``set_key`` set any."""

    weight: float
    concurrency: int | None
    rates: tuple[RateLimit, ...]
    reserve: int
    max_waiting: int | None
    bound_field: str
    own: bool


def resolve(config: QueueConfig, key: str | None, override: Mapping[str, Any] | None) -> KeyRules:
    """*key*'s rules: its ``keys=`` entry, *override* on top, the defaults under both
    (*key* ``None``: the rules of a key with no settings of its own)."""
    mine = DEFAULT_KEY if key is None else config.key_config(key)
    values = {f: getattr(mine, f) for f in KEY_FIELDS}
    if override:
        values.update(override)
    own_wait = values["max_waiting"] is not None
    return KeyRules(
        weight=float(values["weight"]),
        concurrency=values["concurrency"] if values["concurrency"] is not None
        else config.per_key_concurrency,
        rates=as_tuple(values["rate_limit"]) if values["rate_limit"] is not None
        else config.per_key_rate_limits,
        reserve=values["reserve"] if values["reserve"] is not None
        else (config.per_key_reserve or 0),
        max_waiting=values["max_waiting"] if own_wait else config.per_key_max_waiting,
        bound_field=key_field(key or "", "max_waiting") if own_wait else "per_key_max_waiting",
        own=key is not None and (key in config.keys or bool(override)))


class KeyTable:
    """Every key's rules in one queue, with the run-time overrides. Not thread-safe."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.overrides: dict[str, dict[str, Any]] = {}
        self._bound_overrides: set[str] = set()  # the keys whose override sets max_waiting
        self._cache: dict[str, KeyRules] = {}
        self.default = resolve(config, None, None)

    def configure(self, config: QueueConfig) -> None:
        self.config = config
        self._cache.clear()
        self.default = resolve(config, None, None)

    def of(self, key: str) -> KeyRules:
        """*key*'s rules in force."""
        rules = self._cache.get(key)
        if rules is None:
            if key not in self.config.keys and key not in self.overrides:
                return self.default
            rules = self._cache[key] = resolve(self.config, key, self.overrides.get(key))
        return rules

    def set(self, key: str, changes: Mapping[str, Any]) -> KeyConfig:
        """``set_key``: checked as ``keys=`` is; the key's settings in force after."""
        new = self.config.key_override(key, self.overrides.get(key, {}), changes)
        if new:
            self.overrides[key] = new
        else:
            self.overrides.pop(key, None)
        if new.get("max_waiting") is not None:
            self._bound_overrides.add(key)
        else:
            self._bound_overrides.discard(key)
        self._cache.pop(key, None)
        return self.config.key_settings(key, new)

    def reset(self, key: str) -> None:
        self.overrides.pop(key, None)
        self._bound_overrides.discard(key)
        self._cache.pop(key, None)

    def waiting_bounded(self) -> bool:
        """True if some call of the queue may be refused for a full waiting bound: one of
        its config (:func:`waiting_bounded`) or of a key's run-time override."""
        return bool(self._bound_overrides) or waiting_bounded(self.config)

    def grouped(self) -> bool:
        """True if the queue keeps one line per key (some key has settings of its own)."""
        return bool(self.overrides) or grouped(self.config)

    def capped(self) -> bool:
        """True if some key may have a concurrency cap or a reserve (keys' slots are counted)."""
        c = self.config
        return (c.per_key_concurrency is not None or bool(c.per_key_reserve)
                or any(k.concurrency is not None or k.reserve for k in c.keys.values())
                or any(o.get("concurrency") is not None or o.get("reserve")
                       for o in self.overrides.values()))


def waiting_bounded(config: QueueConfig) -> bool:
    """True when *config* bounds how many calls may wait (the queue's, per key, or a key's)."""
    return (config.max_waiting is not None or config.per_key_max_waiting is not None
            or any(k.max_waiting is not None for k in config.keys.values()))


def grouped(config: QueueConfig) -> bool:
    """True if *config* keeps one line per ``fairness_key`` (else one shared line): under
    ``fairness="key"``, and wherever keys may differ (a per-key cap, reserve or bound, or
    ``keys=``). Lines per key serve in the same order as one line would under ``fifo``."""
    return (config.fairness == "key" or config.per_key_concurrency is not None
            or config.per_key_reserve is not None or config.per_key_max_waiting is not None
            or bool(config.keys))


__all__ = ["KeyRules", "KeyTable", "grouped", "resolve", "waiting_bounded"]
