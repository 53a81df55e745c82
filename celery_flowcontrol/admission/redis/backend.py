"""Redis admission backend: every cap exact across a fleet.

Features
    The whole admission contract of :mod:`..base`, decided atomically in Redis: each public
    call is one Lua script (``admission/redis/lua/<method>.lua`` after the modules it declares
    in :mod:`.scripts`, the Lua twins of :class:`~..queue_state.QueueState` and its parts), so
    every worker instance sharing the server sees one truth. Grants are announced on a pub/sub
    channel. All redis keys of one flow queue share one hash tag (``fc:{emails}:slots``), so
    it runs unchanged on Redis Cluster.

Connection
    ``redis://[:password@]host[:port][/db]``, ``rediss://...``, ``unix://path``,
    ``sentinel://host:26379;sentinel://host2:26379/1`` (the master named by
    ``flowcontrol_backend_options["master_name"]``) or ``redis+cluster://h1:7000,h2:7001``
    (``rediss+cluster://`` with TLS) in ``flowcontrol_backend_url``, with
    ``flowcontrol_backend_options`` (passwords, TLS, timeouts: :mod:`.urls`), through
    :meth:`RedisBackend.from_url`; or a ready client:
    ``RedisBackend(redis.Redis(...))`` or ``RedisBackend(redis.cluster.RedisCluster(...))``.
    Needs the ``redis`` extra (``pip install 'celery-flowcontrol[redis]'``).

Options
    ``key_prefix`` (``"fc"``; redis keys are ``<prefix>:{<queue>}:<part>``, the registry of queue
    names ``<prefix>:queues``, the grants channel ``<prefix>:grants``), ``instance_ttl``
    (30 s), ``grant_ttl`` (120 s), ``waiter_ttl`` (600 s), ``clock`` (``None``: each decision
    reads Redis ``TIME``, one clock for the whole fleet; a callable returning float seconds is
    passed to the scripts in whole milliseconds instead; tests use it to drive window maths).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ...config import QueueConfig
from ...errors import (
    FlowControlConfigError,
    MissingDependencyError,
    SettleError,
    UnknownQueueError,
)
from ..base import (
    AdmissionBackend,
    Decision,
    Grant,
    GrantCallback,
    Place,
    QueueStats,
    ReclaimReport,
    Slot,
    Subscription,
    Ticket,
    Waiter,
    check_capacity_override,
    check_max_hold_override,
    check_rate_override,
)
from ..quota import check_actual, check_backoff
from . import codec, urls
from .codec import NAME_RE, PREFIX_RE, SETTLED, UNKNOWN, RedisKeys
from .grants import Listeners
from .loop import LoopCalls
from .scripts import Scripts
from .tenant_calls import TenantCalls


def import_redis() -> Any:
    """The ``redis`` module, or :class:`MissingDependencyError` naming the extra."""
    try:
        import redis
        import redis.cluster  # noqa: F401 - RedisCluster is told apart from redis.Redis
    except ImportError as exc:
        raise MissingDependencyError("redis", "redis") from exc
    return redis


class RedisBackend(TenantCalls, AdmissionBackend):
    """Admission state in Redis, shared by every process that uses the same key prefix."""

    def __init__(self, client: Any, *, key_prefix: str = "fc", instance_ttl: float = 30.0,
                 grant_ttl: float = 120.0, waiter_ttl: float = 600.0,
                 clock: Callable[[], float] | None = None, owns_client: bool = False) -> None:
        redis = import_redis()
        if not isinstance(key_prefix, str) or not PREFIX_RE.fullmatch(key_prefix):
            raise FlowControlConfigError(
                f"must be 1-64 characters without braces or spaces, got {key_prefix!r}",
                None, "flowcontrol_key_prefix")
        self.client = client
        self.key_prefix = key_prefix
        self.instance_ttl, self.grant_ttl = float(instance_ttl), float(grant_ttl)
        self.waiter_ttl = float(waiter_ttl)
        self.clock = clock
        self._owns_client = owns_client
        self.rkeys = RedisKeys(key_prefix)
        self.channel = self.rkeys.channel
        # ARGV[1..4] of every script: the same for every call of this backend.
        common = (repr(self.instance_ttl), repr(self.grant_ttl), repr(self.waiter_ttl),
                  self.channel)
        self.scripts = Scripts(client, redis, self.rkeys, common, clock,
                               cluster=isinstance(client, redis.cluster.RedisCluster))
        self.listeners = Listeners(client, self.channel, redis)

    @classmethod
    def from_url(cls, url: str, *, options: Mapping[str, Any] | None = None,
                 key_prefix: str = "fc", instance_ttl: float = 30.0, grant_ttl: float = 120.0,
                 waiter_ttl: float = 600.0, clock: Callable[[], float] | None = None,
                 **client_options: Any) -> RedisBackend:
        """Connect to what *url* names with *options* (``flowcontrol_backend_options``): one
        server (``redis://``, ``rediss://``, ``unix://``), a Sentinel-managed master
        (``sentinel://h:26379;sentinel://h2:26379/1``) or a Redis Cluster
        (``redis+cluster://h1:7000,h2:7001``); :mod:`.urls` says which options each takes.
        *client_options* go to the redis-py client unchecked.

        :raises FlowControlConfigError: for a bad URL or option, before any connection.
        """
        target = urls.parse(url, options)
        redis = import_redis()
        client = urls.client_for(replace(target, client={**target.client, **client_options}), redis)
        return cls(client, key_prefix=key_prefix, instance_ttl=instance_ttl,
                   grant_ttl=grant_ttl, waiter_ttl=waiter_ttl, clock=clock, owns_client=True)

    def redis_key(self, queue: str, part: str) -> str:
        """The one redis key builder: ``<prefix>:{<queue>}:<part>`` (the braces are the hash tag)."""
        return self.rkeys.redis_key(queue, part)

    def _registered(self) -> list[str]:
        with self.scripts.guard():
            return sorted(codec.text(n) for n in self.client.smembers(self.rkeys.registry))

    def _add_to_registry(self, name: str) -> None:
        # The registry lives in another cluster slot, so it is a second call; a crash in
        # between leaves a working queue missing from queues() until the next register.
        with self.scripts.guard():
            self.client.sadd(self.rkeys.registry, name)

    # -- queues ---------------------------------------------------------------------------
    def register(self, config: QueueConfig) -> None:
        args = codec.config_args(config)
        _, pending = self.scripts.run("register", config.name, *args)
        self._add_to_registry(config.name)
        if pending:
            self.write_keys(config, str(args[-1]))

    def unregister(self, name: str, only_if_idle: bool = False) -> bool:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            return False
        if self.scripts.run("unregister", name, "1" if only_if_idle else "") != 1:
            return False
        with self.scripts.guard():
            self.client.srem(self.rkeys.registry, name)
        return True

    def queues(self) -> list[str]:
        return self._registered()

    def get_config(self, name: str) -> QueueConfig:
        with self.scripts.guard():
            raw = self.client.hget(self.rkeys.cfg(name), "json")
        if raw is None:
            raise UnknownQueueError(name)
        return QueueConfig.from_value(json.loads(raw))

    # -- the hot path ---------------------------------------------------------------------
    def try_admit(self, ticket: Ticket) -> Decision:
        try:
            r = self.scripts.run_hot("admit", ticket.queue, *codec.admit_args(ticket))
        except UnicodeEncodeError:
            codec.check_utf8(ticket)  # names the field (Ticket lets lone surrogates through)
            raise
        if r == codec.COST_REFUSED:
            self.refuse_cost(ticket)
        return codec.decision(ticket, codec.known(r, ticket.queue))

    def try_admit_many(self, tickets: Sequence[Ticket]) -> list[Decision]:
        # One pipeline: each ticket's admit.lua in order, every one at one NOW.
        for t in tickets:  # redis-py would raise a bare UnicodeEncodeError mid-pipeline
            codec.check_utf8(t)
        results = self.scripts.pipelined("admit", [(t.queue, codec.admit_args(t)) for t in tickets])
        decisions = []
        for t, r in zip(tickets, results, strict=True):
            if r == codec.COST_REFUSED:
                self.refuse_cost(t)
            decisions.append(codec.decision(t, codec.known(r, t.queue)))
        return decisions

    def release(self, slot_id: str) -> bool:
        queue = self.rkeys.queue_of(slot_id)
        if queue is None:
            return False
        return self.listeners.released(self.scripts.run_hot("release", queue, slot_id))

    def settle(self, slot_id: str, actual: float) -> float:
        actual = check_actual(slot_id, actual)
        queue = self.rkeys.queue_of(slot_id)
        r = 0 if queue is None else self.scripts.run("settle", queue, slot_id, repr(float(actual)))
        if r == SETTLED:
            raise SettleError("was settled already: settle_cost is once per admission", slot_id)
        if not isinstance(r, list):
            raise SettleError("is not busy: released, reclaimed, or never admitted", slot_id)
        self.listeners.released([1, *r[1:]])  # a refund's announcements, delivered here now
        return codec.number(r[0])

    def backoff(self, queue: str, seconds: float, key: str | None = None) -> float:
        try:
            value = check_backoff(queue, seconds, key)
        except FlowControlConfigError:
            self.get_config(queue)  # an unknown queue is the first error, as in memory
            raise
        if key is not None:
            codec.check_utf8(Ticket(queue, "backoff", "backoff", fairness_key=key))
        r = self.scripts.run("backoff", queue, repr(value), "" if key is None else "1",
                             key or "")
        return float(codec.known(r, queue))

    def on_event_loop(self, hub: Any) -> LoopCalls | None:
        """``try_admit`` and ``release`` answered on kombu's *hub* (:mod:`.loop`); ``None``
        on Redis Cluster, whose client picks a node per key."""
        return None if self.scripts.hot is None else LoopCalls(self.scripts, self.listeners, hub)

    def withdraw(self, queue: str, task_id: str) -> bool:
        return bool(codec.known(self.scripts.run("withdraw", queue, task_id), queue) == 1)

    def heartbeat(self, instance: str, queues: Collection[str] | None = None) -> None:
        self.scripts.run_each("heartbeat", self._registered() if queues is None else list(queues), instance)

    def restore(self, instance: str, config: QueueConfig,
                slots: Sequence[Slot] = ()) -> list[str]:
        args = codec.restore_args(instance, config, slots)
        r = self.scripts.run("restore", config.name, *args)
        if r[0] == 1:  # created: into the registry too (another cluster slot, as register)
            self._add_to_registry(config.name)
            if config.keys:
                self.write_keys(config, str(args[11]))
        return [codec.text(i) for i in r[1:]]

    def reclaim(self, queues: Collection[str] | None = None) -> ReclaimReport:
        report = ReclaimReport()
        for r in self.scripts.run_each("reclaim", self._registered() if queues is None else list(queues), ""):
            if r != UNKNOWN:  # unregistered meanwhile
                report = report + ReclaimReport(*r)
        return report

    # -- grants ---------------------------------------------------------------------------
    def pending_grants(self, queue: str | None = None, *, queues: Collection[str] | None = None) -> list[Grant]:
        names = [queue] if queue is not None else self._with_grants(queues)
        grants: list[Grant] = []
        for name, r in zip(names, self.scripts.run_each("pending_grants", names), strict=True):
            if r == UNKNOWN:
                if queue is not None:
                    raise UnknownQueueError(name)
                continue
            grants.extend(codec.grants(name, r))
        return sorted(grants, key=lambda g: (g.granted_at, g.slot_id))

    def _with_grants(self, queues: Collection[str] | None) -> list[str]:
        """The queues among *queues* (``None``: every registered one) that hold a grant now:
        one pipelined HLEN each.

        Every worker's poller sweeps its queues once a poll interval; a script call costs
        Redis several times the CPU of an HLEN, and most queues hold no grant at any instant
        (docs/sizing.md has the figures). A grant made between the two reads is met by the
        next sweep, as one made just after a sweep is."""
        names = self._registered() if queues is None else list(queues)
        with self.scripts.guard():
            pipe = self.client.pipeline(transaction=False)
            for name in names:
                pipe.hlen(self.rkeys.redis_key(name, "grants"))
            counts = pipe.execute()
        return [name for name, n in zip(names, counts, strict=True) if n]

    def subscribe_grants(self, callback: GrantCallback) -> Subscription:
        return self.listeners.subscribe(callback)

    # -- operators ------------------------------------------------------------------------
    def stats(self, name: str) -> QueueStats:
        return codec.stats(name, codec.known(self.scripts.run("stats", name), name))

    def busy_slots(self, name: str) -> list[Slot]:
        r = codec.known(self.scripts.run("busy_slots", name), name)
        slots = [codec.slot(name, s) for s in r]
        return sorted(slots, key=lambda s: (s.acquired_at, int(s.slot_id.rpartition(":")[2])))

    def place(self, name: str, task_id: str) -> Place | None:
        r = codec.known(self.scripts.run("place", name, task_id), name)
        return Place(int(r[0]), int(r[1]), int(r[2])) if r else None

    def release_rate(self, name: str) -> float:
        return float(codec.known(self.scripts.run("release_rate", name), name))

    def waiters(self, name: str, limit: int = 100) -> list[Waiter]:
        r = codec.known(self.scripts.run("waiters", name, max(0, int(limit))), name)
        return codec.waiters(name, r)

    def set_capacity(self, name: str, capacity: int | None) -> None:
        try:
            value = check_capacity_override(name, capacity)
        except FlowControlConfigError:
            self.get_config(name)  # an unknown queue is the first error, as in memory
            raise
        codec.known(self.scripts.run("set_capacity", name, codec.opt(value)), name)

    def set_rate_limit(self, name: str, value: object) -> None:
        try:
            rates = check_rate_override(name, value)
        except FlowControlConfigError:
            self.get_config(name)  # an unknown queue is the first error, as in memory
            raise
        data = "" if rates is None else json.dumps([r.to_dict() for r in rates])
        codec.known(self.scripts.run("set_rate_limit", name, data), name)

    def set_max_hold(self, name: str, seconds: float | str | None) -> None:
        try:
            value = check_max_hold_override(name, seconds)
        except FlowControlConfigError:
            self.get_config(name)
            raise
        codec.known(self.scripts.run("set_max_hold", name, codec.opt(value)), name)

    def close(self) -> None:
        """Stop grant listeners; close the client if this backend made it."""
        self.listeners.close()
        self.scripts.close()
        if self._owns_client:
            self.client.close()


__all__ = ["RedisBackend", "import_redis"]
