"""How the Redis backend's values travel: redis key names, script arguments, script replies.

Pure functions and one small redis key builder, no I/O: the backend (:mod:`.backend`) and the
event-loop calls (:mod:`.loop`) both encode and decode through here, so the two can't drift.
Times go to the scripts as ``repr`` floats (seconds) or whole milliseconds (NOW) and come
back as ``%.17g`` strings, exact doubles; the layout of each reply is in the header of the
Lua file that makes it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from ...config import QueueConfig, RateLimit
from ...config.key_config import key_field
from ...errors import InvalidTicketError, UnknownQueueError
from ..values import (
    LAZY_LIMIT,
    Admitted,
    Decision,
    Denied,
    Grant,
    QueueStats,
    RateUse,
    Refused,
    Slot,
    Ticket,
    Waiter,
    queue_of_slot,
    restorable,
)

#: What a script returns for a queue that is not registered.
UNKNOWN = -1
#: What admit.lua returns for a cost no per-cost limit admits.
COST_REFUSED = -2
#: What settle.lua returns for an admission settled already.
SETTLED = -3
#: What set_key.lua returns when the stored override changed since the caller read it.
CONFLICT = -4
#: A fairness key's own redis keys (quota.lua's kw:, kl:) outlive its windows by this much.
KEY_MARGIN_MS = 60_000
#: The release rate's epochs (release_fast.lua's relrate), each summing its releases' terms
#: exp((t - epoch) / RELEASE_TAU) / RELEASE_TAU in whole units of 1 / RATE_UNIT: integers,
#: so a release adds its term with HINCRBY, which neither parses nor prints a float as
#: HINCRBYFLOAT does (a long double, each way). An epoch short enough that its largest
#: term (e / RELEASE_TAU, in units) leaves an int64 room for some 10**8 releases a minute;
#: a unit fine enough that rounding each term moves the rate by less than 1e-10 of itself.
RATE_EPOCH_MS = 60_000
RATE_UNIT = 2**40
#: Epochs older than this (their weight below exp(-60)) are dropped.
RATE_KEEP_MS = 3_600_000
NAME_RE = re.compile(r"[a-z0-9._-]{1,64}")
PREFIX_RE = re.compile(r"[^{}\s]{1,64}")


class RedisKeys:
    """The one redis key builder: ``<prefix>:{<queue>}:<part>`` (the braces are the hash tag, so
    every redis key of one queue is in one Redis Cluster slot), the registry of queue names
    ``<prefix>:queues`` and the grants channel ``<prefix>:grants``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.channel = f"{prefix}:grants"
        self.registry = f"{prefix}:queues"
        self._cfg: dict[str, str] = {}

    def redis_key(self, queue: str, part: str) -> str:
        """Redis key *part* of *queue*."""
        return f"{self.prefix}:{{{queue}}}:{part}"

    def cfg(self, queue: str) -> str:
        """The config hash of *queue*, the one redis key every script is called with (the others
        are derived from it in Lua); :class:`UnknownQueueError` for a name no queue can have."""
        rkey = self._cfg.get(queue)
        if rkey is None:
            if not NAME_RE.fullmatch(queue):
                raise UnknownQueueError(queue)  # no such name can ever be registered
            rkey = self._cfg[queue] = self.redis_key(queue, "cfg")
        return rkey

    def queue_of(self, slot_id: str) -> str | None:
        """The queue of *slot_id*; ``None`` when no queue of that name can exist (so no such
        slot is busy)."""
        queue = queue_of_slot(slot_id)
        if queue is None or not slot_id.isascii() or (
                queue not in self._cfg and not NAME_RE.fullmatch(queue)):
            return None
        return queue


# -- arguments ---------------------------------------------------------------------------------
def check_utf8(ticket: Ticket) -> None:
    """:class:`InvalidTicketError` naming the first field of *ticket* Redis can't store."""
    # Ticket accepts lone surrogates (it measures with surrogatepass); Redis can't store them.
    for field in ("task_id", "instance", "fairness_key", "label"):
        try:
            getattr(ticket, field).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidTicketError("must be valid UTF-8 text (no lone surrogates)",
                                     queue=ticket.queue, field=field) from None


def opt(value: object) -> str:
    """An optional number as a script argument: ``""`` for ``None``."""
    return "" if value is None else repr(value)


def config_args(config: QueueConfig) -> list[object]:
    """register.lua's and restore.lua's config arguments, in their order (state.lua's
    ``config_of``), then the config JSON ``get_config`` reads ("" when it is the first) and
    the generation of its ``keys=`` ("" for none: else a digest of them). The rate limits
    go in the JSON only (quota.lua reads them there); the first JSON, the one Lua decodes,
    leaves ``keys=`` out: register_keys.lua writes them, a chunk per call."""
    data = config.to_dict()
    keys, full, generation = data["keys"], "", ""
    if keys:
        full = json.dumps(data)
        generation = hashlib.sha1(json.dumps(keys, sort_keys=True).encode()).hexdigest()
        data["keys"] = {}
    return [json.dumps(data), config.name, opt(config.concurrency),
            opt(config.per_key_concurrency), repr(config.retry), config.fairness, config.order,
            opt(config.max_hold), config.release, full, generation]


def cost_arg(cost: float) -> str:
    """A cost as a script argument: ``"1"`` for the default (admit.lua's fast path reads it
    so), else its exact ``repr``."""
    return "1" if cost == 1 else repr(float(cost))


def admit_args(t: Ticket) -> tuple[str | int, ...]:
    """admit.lua's arguments after NOW (:meth:`.scripts.Scripts.admit_command` writes the
    same ones out by hand: keep the two in step)."""
    return (t.task_id, t.instance, t.priority, t.fairness_key, t.label, LAZY_LIMIT,
            cost_arg(t.cost))


def restore_args(instance: str, config: QueueConfig, slots: Sequence[Slot]) -> list[object]:
    """restore.lua's arguments: the instance, the config, then seven per restorable slot."""
    args: list[object] = [instance, *config_args(config)]
    for s, n in restorable(config.name, slots):
        args += [s.slot_id, n, s.task_id, s.fairness_key, s.label, repr(s.acquired_at),
                 opt(s.expires_at)]
    return args


# -- replies -----------------------------------------------------------------------------------
def text(value: Any) -> str:
    """A reply's string (bytes decoded as UTF-8)."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def known(result: Any, queue: str) -> Any:
    """*result*, or :class:`UnknownQueueError` if the script found no queue *queue*."""
    if result == UNKNOWN:
        raise UnknownQueueError(queue)
    return result


def slot(queue: str, r: Sequence[Any]) -> Slot:
    """A slot reply: ``id, holder, task, key, label, acquired, expires|""``."""
    t = text
    return Slot(t(r[0]), queue, t(r[1]), t(r[2]), t(r[3]), t(r[4]), float(r[5]),
                float(r[6]) if r[6] else None)


def decision(ticket: Ticket, r: Any) -> Decision:
    """admit.lua's reply for *ticket*."""
    if isinstance(r, (bytes, str)):  # the fast path's "<slot id> <acquired ms> <expires>"
        slot_id, acquired, expires = text(r).split(" ")
        return Admitted(Slot(slot_id, ticket.queue, ticket.instance, ticket.task_id,
                             ticket.fairness_key, ticket.label, int(acquired) / 1000,
                             None if expires == "-" else float(expires)))
    if r[0] == 1:
        return Admitted(slot(ticket.queue, r[1:]))
    if r[0] == 2:  # tenants.lua's refusal: {bound, "q" | "o" | "d"}
        kind = text(r[2])
        field = ({"q": "max_waiting", "d": "per_key_max_waiting"}.get(kind)
                 or key_field(ticket.fairness_key, "max_waiting"))
        return Refused(ticket.queue, ticket.fairness_key, int(r[1]), field)
    return Denied(float(r[1]), text(r[2]))


def waiters(name: str, r: Sequence[Any]) -> list[Waiter]:
    """waiters.lua's reply."""
    t = text
    return [Waiter(name, t(w[0]), int(w[1]), t(w[2]), t(w[3]), int(w[4]), t(w[5]),
                   float(w[6]), float(w[7]), float(w[8])) for w in r]


def grants(name: str, r: Sequence[Any]) -> list[Grant]:
    """pending_grants.lua's reply (no instance: it is a routing hint of announcements)."""
    t = text
    return [Grant(name, t(g[0]), t(g[1]), float(g[2]), float(g[3])) for g in r]


def number(value: Any) -> float:
    """A ``%.17g`` reply as a number: an int where it is whole (a count reads as one)."""
    f = float(value)
    return int(f) if f.is_integer() else f


def stats(name: str, r: Sequence[Any]) -> QueueStats:
    """stats.lua's reply."""
    config = QueueConfig.from_value(json.loads(r[0]))
    cap_override = int(r[1]) if r[1] else None
    hold_override = float(r[2]) if r[2] else None
    override = rate_override(r[8])
    limits = config.rate_limits if override is None else override
    rates = tuple(RateUse(rate, number(u[0]), int(float(u[1])) if u[1] else None)
                  for rate, u in zip(limits, r[6], strict=True))
    return QueueStats(
        name=name,
        capacity=config.concurrency if cap_override is None else cap_override,
        concurrency=config.concurrency, capacity_override=cap_override,
        in_use=r[3], granted=r[4], waiting=r[5],
        rate_limit=limits[0] if limits else None,
        rate_used=rates[0].used if rates else 0,
        max_hold=config.max_hold if hold_override is None else hold_override,
        configured_max_hold=config.max_hold, max_hold_override=hold_override,
        rates=rates, backoff_until=float(r[7]) if r[7] else None, rate_override=override,
        paused_until=float(r[9]) if r[9] else None, max_waiting=int(r[10]) if r[10] else None,
        refused=int(r[11]))


def rate_override(raw: Any) -> tuple[RateLimit, ...] | None:
    """The operator's rate limits as stats.lua returns them (JSON, or "" for none)."""
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    return tuple(RateLimit.parse(d) for d in json.loads(text)) if text else None
