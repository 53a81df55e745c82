"""The Redis backend's tenant calls: per-key settings at run time, pauses, refusals and the
keys an operator reads (the Lua twins of :mod:`..tenants`: ``set_key.lua``, ``pause.lua``,
``resume.lua``, ``would_refuse.lua``, ``key_stats.lua``).

A key's run-time override is stored as the JSON of the fields ``set_key`` set (``keyover``,
read by Lua only to resolve the key's rules); the override is checked here, against the
config, and written by a compare-and-set, so two ``set_key`` calls on one key at once never
lose one's fields.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

from ...config import KeyConfig, QueueConfig, parse_rate_limits
from ...config.key_config import check_key, key_field
from ...config.rate_limits import rates_to_data
from ...errors import CostRefusedError, FlowControlError, FlowQueueFull
from ..key_rules import resolve
from ..quota import Quota
from ..tenant_steps import check_until, key_row
from ..values import KeyStats, QueueStats, Refused, Ticket
from . import codec
from .codec import CONFLICT
from .scripts import Scripts

#: How often set_key reads and writes again when another set_key of the key came first.
ATTEMPTS = 8
#: The most keys= entries one register_keys.lua call writes or drops. A key costs that call
#: some tens of microseconds (its entry packed, its rules resolved, its windows looked at),
#: so a call holds Redis for a few tens of milliseconds however many keys a config has.
KEY_CHUNK = 500


def override_data(override: dict[str, Any]) -> str:
    """An override as stored (JSON of the fields set; "" for none)."""
    if not override:
        return ""
    return json.dumps({f: rates_to_data(v) if f == "rate_limit" else v
                       for f, v in override.items()})


def override_of(name: str, key: str, raw: Any) -> dict[str, Any]:
    """The override stored as *raw* (bytes or str JSON; empty for none)."""
    text = codec.text(raw) if raw else ""
    if not text:
        return {}
    data = json.loads(text)
    if "rate_limit" in data:
        data["rate_limit"] = parse_rate_limits(data["rate_limit"], name, key_field(key, "rate_limit"))
    return data


def refusal(name: str, key: str, r: Any) -> FlowQueueFull | None:
    """tenants.lua's refusal reply {bound, "q" | "o" | "d"} as the error, or ``None``."""
    if not r:
        return None
    decided = codec.decision(Ticket(name, "refused", "refused", fairness_key=key), [2, *r])
    assert isinstance(decided, Refused)
    return decided.error()


class TenantCalls:
    """``set_key``, ``reset_key``, ``pause``, ``resume``, ``key_stats``, ``would_refuse`` and
    the cost refusal (a key's own limits included) of :class:`~.backend.RedisBackend` (a
    mixin: it has ``scripts``, ``client`` and ``rkeys``)."""

    scripts: Scripts
    client: Any
    rkeys: codec.RedisKeys

    grant_ttl: float

    def get_config(self, name: str) -> QueueConfig:
        raise NotImplementedError

    def stats(self, name: str) -> QueueStats:
        raise NotImplementedError

    def refuse_cost(self, ticket: Ticket) -> None:
        """Raise the :class:`CostRefusedError` admit.lua answered for *ticket* (naming the
        limit: the queue's own, or the operator's override of them, as its stats say)."""
        rates = tuple(u.rate for u in self.stats(ticket.queue).rates)
        config = replace(self.get_config(ticket.queue), rate_limit=rates or None)
        override = self._override(ticket.queue, ticket.fairness_key)[1]  # its own limits
        Quota(config, self.grant_ttl,
              lambda key: resolve(config, key, override).rates).check_cost(ticket)
        raise CostRefusedError(f"cost {ticket.cost:g} is above what a per-cost limit admits",
                               ticket.queue, "flow_cost")  # the config changed meanwhile



    def write_keys(self, config: QueueConfig, generation: str) -> None:
        """Write *config*'s ``keys=`` (generation *generation*, codec.config_args) after
        register.lua took the rest of it: :data:`KEY_CHUNK` keys per register_keys.lua call,
        then the keys a former config had and this one has not dropped, the last call marking
        the generation written. Each call is atomic and may be repeated; their overrides
        (``set_key``) keep winning. Stops when another registration began meanwhile: that one
        writes its own keys."""
        name = config.name
        entries = config.to_dict()["keys"]
        with self.scripts.guard():
            known = {codec.text(k) for k, _ in self.client.hscan_iter(
                self.rkeys.redis_key(name, "keyconf"), count=KEY_CHUNK)}
        pairs = [item for key, entry in entries.items() for item in (key, json.dumps(entry))]
        pairs += [item for key in sorted(known - set(entries)) for item in (key, "")]
        step = 2 * KEY_CHUNK
        for i in range(0, max(len(pairs), 1), step):
            last = "1" if i + step >= len(pairs) else ""
            r = codec.known(self.scripts.run("register_keys", name, generation, last,
                                             *pairs[i:i + step]), name)
            if r == 0:
                return

    def _override(self, name: str, key: str) -> tuple[str, dict[str, Any]]:
        with self.scripts.guard():
            raw = self.client.hget(self.rkeys.redis_key(name, "keyover"), key)
        return (codec.text(raw) if raw else ""), override_of(name, key, raw)

    def _check_key(self, name: str, key: object) -> str:
        config = self.get_config(name)  # an unknown queue is the first error
        key = check_key(config.name, key)
        codec.check_utf8(Ticket(name, "key", "key", fairness_key=key))
        return key

    def set_key(self, name: str, key: str, **fields: Any) -> KeyConfig:
        self._check_key(name, key)
        for _ in range(ATTEMPTS):
            config = self.get_config(name)
            raw, current = self._override(name, key)
            new = config.key_override(key, current, fields)
            r = codec.known(self.scripts.run("set_key", name, key, override_data(new), raw), name)
            if r != CONFLICT:
                return config.key_settings(key, new)
        raise FlowControlError(f"flow queue {name!r}: key {key!r}: set_key met {ATTEMPTS} "
                               "other changes of this key at once; try again")

    def reset_key(self, name: str, key: str) -> None:
        self._check_key(name, key)
        for _ in range(ATTEMPTS):
            raw, _ = self._override(name, key)
            if codec.known(self.scripts.run("set_key", name, key, "", raw), name) != CONFLICT:
                return
        raise FlowControlError(f"flow queue {name!r}: key {key!r}: reset_key met {ATTEMPTS} "
                               "other changes of this key at once; try again")

    def pause(self, name: str, key: str | None = None, until: float | None = None) -> None:
        end = check_until(name, until)
        if key is not None:
            key = self._check_key(name, key)
        codec.known(self.scripts.run("pause", name, "q" if key is None else "k", key or "",
                                     "" if end == math.inf else repr(end)), name)

    def resume(self, name: str, key: str | None = None) -> None:
        if key is not None:
            key = self._check_key(name, key)
        codec.known(self.scripts.run("resume", name, "q" if key is None else "k", key or ""),
                    name)

    def key_stats(self, name: str, limit: int = 20) -> list[KeyStats]:
        r = codec.known(self.scripts.run("key_stats", name, max(0, int(limit))), name)
        config = self.get_config(name) if r else None
        rows = []
        for key_raw, busy, waiting, paused, admitted, over in r:
            key = codec.text(key_raw)
            assert config is not None
            rules = resolve(config, key, override_of(name, key, over))
            rows.append(key_row(key, rules, int(busy), int(waiting),
                                float(paused) if paused else None, int(admitted)))
        return rows

    def waiting_bounded(self, name: str) -> bool:
        # key_settings.lua's flag, one plain read; absent (a queue unknown, or registered
        # before the flag existed): True, and would_refuse says what holds.
        with self.scripts.guard():
            raw = self.client.hget(self.rkeys.cfg(name), "wb")
        return raw is None or codec.text(raw) != "0"

    def would_refuse(self, name: str, key: str) -> FlowQueueFull | None:
        return refusal(name, key, codec.known(self.scripts.run("would_refuse", name, key), name))
