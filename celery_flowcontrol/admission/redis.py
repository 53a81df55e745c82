"""Redis admission backend: every cap exact across a fleet.

Features
    The whole admission contract of :mod:`.base`, decided atomically in Redis: each public
    call is one Lua script (``admission/lua/<method>.lua`` on top of ``queue_state.lua``, the
    Lua twin of :class:`~.queue_state.QueueState`), so every worker instance sharing the
    server sees one truth. Grants are announced on a pub/sub channel. All keys of one flow
    queue share one hash tag (``fc:{emails}:slots``), so it runs unchanged on Redis Cluster.

Connection
    ``redis://[:password@]host[:port][/db]``, ``rediss://...`` or ``unix://path``
    (``flowcontrol_backend_url``) through :meth:`RedisBackend.from_url`, or a ready client:
    ``RedisBackend(redis.Redis(...))`` or ``RedisBackend(redis.cluster.RedisCluster(...))``.
    Needs the ``redis`` extra (``pip install 'celery-flowcontrol[redis]'``).

Options
    ``key_prefix`` (``"fc"``; keys are ``<prefix>:{<queue>}:<part>``, the registry of queue
    names ``<prefix>:queues``, the grants channel ``<prefix>:grants``), ``instance_ttl``
    (30 s), ``grant_ttl`` (120 s), ``waiter_ttl`` (600 s), ``clock`` (``None``: each decision
    reads Redis ``TIME``, one clock for the whole fleet; a callable returning float seconds is
    passed to the scripts in whole milliseconds instead; tests use it to drive window maths).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any

from ..config import QueueConfig
from ..errors import (
    BackendUnavailableError,
    FlowControlConfigError,
    InvalidTicketError,
    MissingDependencyError,
    UnknownQueueError,
)
from .base import (
    LAZY_LIMIT,
    AdmissionBackend,
    Admitted,
    Decision,
    Denied,
    Grant,
    GrantCallback,
    QueueStats,
    ReclaimReport,
    Slot,
    Subscription,
    Ticket,
    Waiter,
    check_capacity_override,
    check_max_hold_override,
    queue_of_slot,
    restorable,
)
from .redis_async import LoopCalls
from .redis_hotpath import HotPath, bulk
from .redis_pubsub import GrantListener

#: One script per atomic operation (see :func:`script_source` for how each is assembled).
SCRIPTS = ("admit", "release", "withdraw", "heartbeat", "reclaim", "register", "unregister",
           "set_capacity", "set_max_hold", "stats", "waiters", "busy_slots", "pending_grants",
           "restore")
UNKNOWN = -1
_LAZY_LIMIT_BULK = bulk(LAZY_LIMIT)
_NAME_RE = re.compile(r"[a-z0-9._-]{1,64}")
_PREFIX_RE = re.compile(r"[^{}\s]{1,64}")


def import_redis() -> Any:
    """The ``redis`` module, or :class:`MissingDependencyError` naming the extra."""
    try:
        import redis
        import redis.cluster  # noqa: F401 - RedisCluster is told apart from redis.Redis
    except ImportError as exc:
        raise MissingDependencyError("redis", "redis") from exc
    return redis


def _lua(name: str) -> str:
    return resources.files(__package__).joinpath(f"lua/{name}.lua").read_text("utf-8")


def script_source(name: str) -> str:
    """The script run for method *name*: ``keys.lua``, then ``<name>.lua`` with its lines
    ``--@prelude`` and ``--@queue_state`` replaced by those files (both at its top when it has
    neither marker). A line ``--@keys`` places ``keys.lua`` there instead of first. See
    ``keys.lua`` for why the hot paths place them late."""
    op = _lua(name)
    markers = ("--@prelude", "--@queue_state")
    if not any(f"\n{m}\n" in op for m in markers):
        op = "\n".join(markers) + "\n" + op
    if "\n--@keys\n" not in op:
        op = "--@keys\n" + op
    lines = [_lua(line[3:]) if line in ("--@keys", *markers) else line
             for line in op.split("\n")]
    return "\n".join(lines)


def _utf8(ticket: Ticket) -> None:
    # Ticket accepts lone surrogates (it measures with surrogatepass); Redis can't store them.
    for field in ("task_id", "instance", "fairness_key", "label"):
        try:
            getattr(ticket, field).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidTicketError("must be valid UTF-8 text (no lone surrogates)",
                                     queue=ticket.queue, field=field) from None


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _opt(value: object) -> str:
    return "" if value is None else repr(value)


class RedisBackend(AdmissionBackend):
    """Admission state in Redis, shared by every process that uses the same key prefix."""

    def __init__(self, client: Any, *, key_prefix: str = "fc", instance_ttl: float = 30.0,
                 grant_ttl: float = 120.0, waiter_ttl: float = 600.0,
                 clock: Callable[[], float] | None = None, owns_client: bool = False) -> None:
        self._redis = import_redis()
        if not isinstance(key_prefix, str) or not _PREFIX_RE.fullmatch(key_prefix):
            raise FlowControlConfigError(
                f"must be 1-64 characters without braces or spaces, got {key_prefix!r}",
                None, "flowcontrol_key_prefix")
        self.client = client
        self.key_prefix = key_prefix
        self.instance_ttl = float(instance_ttl)
        self.grant_ttl = float(grant_ttl)
        self.waiter_ttl = float(waiter_ttl)
        self.clock = clock
        self._owns_client = owns_client
        self.channel = f"{key_prefix}:grants"
        self._registry = f"{key_prefix}:queues"
        self._cluster = isinstance(client, self._redis.cluster.RedisCluster)
        # ARGV[1..4] of every script: the same for every call of this backend.
        self._common = (repr(self.instance_ttl), repr(self.grant_ttl), repr(self.waiter_ttl),
                        self.channel)
        self._cfg_keys: dict[str, str] = {}
        self._listeners: list[GrantListener] = []
        self._scripts = {name: client.register_script(script_source(name)) for name in SCRIPTS}
        self._text: Callable[[Any], str] = _text
        # try_admit and release skip redis-py's command dispatch (see redis_hotpath).
        self._hot = None if self._cluster else HotPath(client, self._redis)

    @classmethod
    def from_url(cls, url: str, *, key_prefix: str = "fc", instance_ttl: float = 30.0,
                 grant_ttl: float = 120.0, waiter_ttl: float = 600.0,
                 clock: Callable[[], float] | None = None, **client_options: Any) -> RedisBackend:
        """Connect to the server at *url* (``redis://``, ``rediss://``, ``unix://``)."""
        redis = import_redis()
        client = redis.Redis.from_url(url, **client_options)
        return cls(client, key_prefix=key_prefix, instance_ttl=instance_ttl,
                   grant_ttl=grant_ttl, waiter_ttl=waiter_ttl, clock=clock, owns_client=True)

    # -- plumbing ---------------------------------------------------------------------------
    def key(self, queue: str, part: str) -> str:
        """The one key builder: ``<prefix>:{<queue>}:<part>`` (the braces are the hash tag)."""
        return f"{self.key_prefix}:{{{queue}}}:{part}"

    def _cfg(self, queue: str) -> str:
        key = self._cfg_keys.get(queue)
        if key is None:
            if not _NAME_RE.fullmatch(queue):
                raise UnknownQueueError(queue)  # no such name can ever be registered
            key = self._cfg_keys[queue] = self.key(queue, "cfg")
        return key

    def _now(self) -> str:
        # The scripts read Redis TIME when no clock was given: never two clocks in one window.
        return "" if self.clock is None else str(round(self.clock() * 1000))

    @contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except self._redis.RedisError as exc:
            raise BackendUnavailableError(f"Redis admission backend: {exc}") from exc

    def _args(self, now: str, *args: object) -> list[object]:
        return [*self._common, now, *args]

    def _run(self, name: str, queue: str, *args: object) -> Any:
        key = self._cfg(queue)
        with self._guard():
            return self._scripts[name]([key], self._args(self._now(), *args))

    def _run_hot(self, name: str, queue: str, *args: str | int) -> Any:
        if self._hot is None:
            return self._run(name, queue, *args)
        key = self._cfg(queue)
        try:  # not self._guard(): a context manager costs more than the rest of this method
            return self._hot(self._scripts[name], key, self._common, (self._now(), *args))
        except self._redis.RedisError as exc:
            raise BackendUnavailableError(f"Redis admission backend: {exc}") from exc

    def _run_each(self, name: str, queues: Sequence[str], *args: object) -> list[Any]:
        """One script call per queue, pipelined, all at one *now*."""
        return self._pipelined(name, [(q, args) for q in queues])

    def _pipelined(self, name: str, calls: Sequence[tuple[str, Sequence[object]]]) -> list[Any]:
        """Script *name* once per ``(queue, args)``, in one pipeline, all at one *now*."""
        if not calls:
            return []
        now = self._now()
        script = self._scripts[name]
        with self._guard():
            if self._cluster:
                # redis-py refuses EVALSHA in a cluster pipeline: one call per queue instead.
                return [script([self._cfg(q)], self._args(now, *a)) for q, a in calls]
            for attempt in (1, 2):
                pipe = self.client.pipeline(transaction=False)
                for q, a in calls:
                    pipe.evalsha(script.sha, 1, self._cfg(q), *self._args(now, *a))
                results = pipe.execute(raise_on_error=False)
                if attempt == 2 or not any(isinstance(r, self._redis.exceptions.NoScriptError)
                                           for r in results):
                    break
                script.sha = self.client.script_load(script.script)  # the server forgot it
            for r in results:
                if isinstance(r, Exception):
                    raise r
            return list(results)

    def _admit_pipelined(self, tickets: Sequence[Ticket]) -> list[Decision]:
        """``try_admit`` for many tickets in one pipeline (benchmarks fill queues with it).

        Not for the hot path: a NOSCRIPT reply makes the whole batch run twice.
        """
        for t in tickets:  # redis-py would raise a bare UnicodeEncodeError mid-pipeline
            _utf8(t)
        results = self._pipelined("admit", [(t.queue, self._admit_args(t)) for t in tickets])
        return [self._decision(t, self._unknown(r, t.queue)) for t, r in zip(tickets, results,
                                                                             strict=True)]

    def _unknown(self, result: Any, queue: str) -> Any:
        if result == UNKNOWN:
            raise UnknownQueueError(queue)
        return result

    def _slot(self, queue: str, r: Sequence[Any]) -> Slot:
        t = self._text
        return Slot(t(r[0]), queue, t(r[1]), t(r[2]), t(r[3]), t(r[4]), float(r[5]),
                    float(r[6]) if r[6] else None)

    def _registered(self) -> list[str]:
        with self._guard():
            return sorted(self._text(n) for n in self.client.smembers(self._registry))

    # -- queues ---------------------------------------------------------------------------
    def register(self, config: QueueConfig) -> None:
        rate = config.rate_limit
        self._run("register", config.name, json.dumps(config.to_dict()), config.name,
                  _opt(config.concurrency), _opt(config.per_key_concurrency),
                  repr(config.retry), config.fairness, config.order, _opt(config.max_hold),
                  rate.algorithm if rate else "", _opt(rate and rate.limit),
                  _opt(rate and rate.period), _opt(rate and rate.burst), config.release)
        # The registry lives in another cluster slot, so it is a second call; a crash in
        # between leaves a working queue missing from queues() until the next register.
        with self._guard():
            self.client.sadd(self._registry, config.name)

    def unregister(self, name: str, only_if_idle: bool = False) -> bool:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            return False
        if self._run("unregister", name, "1" if only_if_idle else "") != 1:
            return False
        with self._guard():
            self.client.srem(self._registry, name)
        return True

    def queues(self) -> list[str]:
        return self._registered()

    def get_config(self, name: str) -> QueueConfig:
        with self._guard():
            raw = self.client.hget(self._cfg(name), "json")
        if raw is None:
            raise UnknownQueueError(name)
        return QueueConfig.from_value(json.loads(raw))

    # -- the hot path ---------------------------------------------------------------------
    def try_admit(self, ticket: Ticket) -> Decision:
        try:
            r = self._run_hot("admit", ticket.queue, *self._admit_args(ticket))
        except UnicodeEncodeError:
            _utf8(ticket)  # names the field (Ticket lets lone surrogates through)
            raise
        return self._decision(ticket, self._unknown(r, ticket.queue))

    @staticmethod
    def _admit_args(t: Ticket) -> tuple[str | int, ...]:
        return (t.task_id, t.instance, t.priority, t.fairness_key, t.label, LAZY_LIMIT)

    def _admit_command(self, t: Ticket) -> bytes:
        """admit.lua's ``EVALSHA`` for *t* as RESP bytes, NOW then :meth:`_admit_args`, at one
        format: every admission on the event loop sends one (keep the two in step)."""
        assert self._hot is not None  # only LoopCalls calls it
        head = self._hot.head(self._scripts["admit"], self._cfg(t.queue), self._common, 7)
        now, tid, inst = self._now().encode(), t.task_id.encode(), t.instance.encode()
        prio, key, label = b"%d" % t.priority, t.fairness_key.encode(), t.label.encode()
        return b"%s$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n%s" % (
            head, len(now), now, len(tid), tid, len(inst), inst, len(prio), prio, len(key), key,
            len(label), label, _LAZY_LIMIT_BULK)

    def _release_command(self, queue: str, slot_id: str) -> bytes:
        """release.lua's ``EVALSHA`` for *slot_id* of *queue* as RESP bytes (see
        :meth:`_admit_command`)."""
        assert self._hot is not None
        head = self._hot.head(self._scripts["release"], self._cfg(queue), self._common, 2)
        now, slot = self._now().encode(), slot_id.encode()
        return b"%s$%d\r\n%s\r\n$%d\r\n%s\r\n" % (head, len(now), now, len(slot), slot)

    def _decision(self, ticket: Ticket, r: Any) -> Decision:
        if isinstance(r, (bytes, str)):  # the fast path's "<slot id> <acquired> <expires>"
            slot_id, acquired, expires = self._text(r).split(" ")
            return Admitted(Slot(slot_id, ticket.queue, ticket.instance, ticket.task_id,
                                 ticket.fairness_key, ticket.label, float(acquired),
                                 None if expires == "-" else float(expires)))
        if r[0] == 1:
            return Admitted(self._slot(ticket.queue, r[1:]))
        return Denied(float(r[1]), self._text(r[2]))

    def release(self, slot_id: str) -> bool:
        queue = self._queue_of(slot_id)
        if queue is None:
            return False
        return self._released(self._run_hot("release", queue, slot_id))

    def _queue_of(self, slot_id: str) -> str | None:
        """The queue of *slot_id*; ``None`` when no queue of that name can exist (so no such
        slot is busy)."""
        queue = queue_of_slot(slot_id)
        if queue is None or not slot_id.isascii() or (
                queue not in self._cfg_keys and not _NAME_RE.fullmatch(queue)):
            return None
        return queue

    def _released(self, r: Any) -> bool:
        """release.lua's reply: whether the slot was busy."""
        if isinstance(r, list):  # it granted slots on: hand them to our listeners now
            for listener in list(self._listeners):
                for payload in r[1:]:
                    listener.deliver_here(payload)
            return True
        return r == 1

    def on_event_loop(self, hub: Any) -> LoopCalls | None:
        """``try_admit`` and ``release`` answered on kombu's *hub* (redis_async); ``None``
        on Redis Cluster, whose client picks a node per key."""
        return None if self._hot is None else LoopCalls(self, hub)

    def withdraw(self, queue: str, task_id: str) -> bool:
        return bool(self._unknown(self._run("withdraw", queue, task_id), queue) == 1)

    def heartbeat(self, instance: str) -> None:
        self._run_each("heartbeat", self._registered(), instance)

    def restore(self, instance: str, config: QueueConfig,
                slots: Sequence[Slot] = ()) -> list[str]:
        rate = config.rate_limit
        args: list[object] = [
            instance, json.dumps(config.to_dict()), config.name, _opt(config.concurrency),
            _opt(config.per_key_concurrency), repr(config.retry), config.fairness, config.order,
            _opt(config.max_hold), rate.algorithm if rate else "", _opt(rate and rate.limit),
            _opt(rate and rate.period), _opt(rate and rate.burst), config.release]
        for s, n in restorable(config.name, slots):
            args += [s.slot_id, n, s.task_id, s.fairness_key, s.label, repr(s.acquired_at),
                     _opt(s.expires_at)]
        r = self._run("restore", config.name, *args)
        if r[0] == 1:  # created: into the registry too (another cluster slot, as register)
            with self._guard():
                self.client.sadd(self._registry, config.name)
        return [self._text(i) for i in r[1:]]

    def reclaim(self) -> ReclaimReport:
        report = ReclaimReport()
        for r in self._run_each("reclaim", self._registered(), ""):
            if r != UNKNOWN:  # unregistered meanwhile
                report = report + ReclaimReport(*r)
        return report

    # -- grants ---------------------------------------------------------------------------
    def pending_grants(self, queue: str | None = None) -> list[Grant]:
        names = [queue] if queue is not None else self._registered()
        t = self._text
        grants: list[Grant] = []
        for name, r in zip(names, self._run_each("pending_grants", names), strict=True):
            if r == UNKNOWN:
                if queue is not None:
                    raise UnknownQueueError(name)
                continue
            grants.extend(Grant(name, t(g[0]), t(g[1]), float(g[2]), float(g[3])) for g in r)
        return sorted(grants, key=lambda g: (g.granted_at, g.slot_id))

    def subscribe_grants(self, callback: GrantCallback) -> Subscription:
        listener = GrantListener(self.client, self.channel, callback, self._redis,
                                 self._listeners.remove)
        self._listeners.append(listener)
        return listener

    # -- operators ------------------------------------------------------------------------
    def stats(self, name: str) -> QueueStats:
        r = self._unknown(self._run("stats", name), name)
        config = QueueConfig.from_value(json.loads(r[0]))
        cap_override = int(r[1]) if r[1] else None
        hold_override = float(r[2]) if r[2] else None
        return QueueStats(
            name=name,
            capacity=config.concurrency if cap_override is None else cap_override,
            configured_capacity=config.concurrency, capacity_override=cap_override,
            in_use=r[3], granted=r[4], waiting=r[5], rate_limit=config.rate_limit,
            rate_used=r[6], max_hold=config.max_hold if hold_override is None else hold_override,
            configured_max_hold=config.max_hold, max_hold_override=hold_override)

    def busy_slots(self, name: str) -> list[Slot]:
        r = self._unknown(self._run("busy_slots", name), name)
        slots = [self._slot(name, s) for s in r]
        return sorted(slots, key=lambda s: (s.acquired_at, int(s.slot_id.rpartition(":")[2])))

    def waiters(self, name: str, limit: int = 100) -> list[Waiter]:
        t = self._text
        r = self._unknown(self._run("waiters", name, max(0, int(limit))), name)
        return [Waiter(name, t(w[0]), int(w[1]), t(w[2]), t(w[3]), int(w[4]), t(w[5]),
                       float(w[6]), float(w[7])) for w in r]

    def set_capacity(self, name: str, capacity: int | None) -> None:
        try:
            value = check_capacity_override(name, capacity)
        except FlowControlConfigError:
            self.get_config(name)  # an unknown queue is the first error, as in memory
            raise
        self._unknown(self._run("set_capacity", name, _opt(value)), name)

    def set_max_hold(self, name: str, seconds: float | str | None) -> None:
        try:
            value = check_max_hold_override(name, seconds)
        except FlowControlConfigError:
            self.get_config(name)
            raise
        self._unknown(self._run("set_max_hold", name, _opt(value)), name)

    def close(self) -> None:
        """Stop grant listeners; close the client if this backend made it."""
        for listener in list(self._listeners):
            listener.close()
        if self._hot is not None:
            self._hot.close()
        if self._owns_client:
            self.client.close()


__all__ = ["RedisBackend", "import_redis", "script_source", "SCRIPTS"]
