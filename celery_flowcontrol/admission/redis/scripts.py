"""The Redis backend's Lua scripts: what each is made of, and the ways each is called.

One script per atomic operation, ``lua/<method>.lua``, sent after the modules it declares in
:data:`SCRIPTS` and under the constants of :data:`CONSTANTS` (:func:`script_source`, through
the package's one loader, :mod:`...lua_loader`), and registered on the client by
:class:`Scripts`. Every script takes one redis key, the queue's config hash
(:meth:`.codec.RedisKeys.cfg`), and ARGV ``instance_ttl, grant_ttl, waiter_ttl, channel,
NOW, ...``. :class:`Scripts` calls them through redis-py (:meth:`run`, pipelined over many queues by
:meth:`run_each`), on the hot path past redis-py's command dispatch (:meth:`run_hot`,
:mod:`.wire`), or hands the event-loop calls (:mod:`.loop`) the RESP bytes of a call to write
themselves (:meth:`admit_command`, :meth:`release_command`).

The modules mirror the reference's parts: ``keys`` and ``key_table`` (redis keys, common ARGV;
:mod:`.codec`), ``state`` (the state record S, the clock, capacity), ``windows`` (:mod:`..windows`),
``key_windows`` and ``quota`` (:mod:`..quota`), ``slot_records`` and ``busy`` (:mod:`..busy`),
``lines`` (:mod:`..lines`), ``grants`` and ``queue_state`` (:mod:`..queue_state`),
``settling`` (:mod:`..settling`) and ``reads`` (the operator's view of the lines).
``admit_fast``, ``release_fast`` and ``reclaim_fast`` are the first steps of admit, release and
reclaim, sent before the modules only their full work needs (admit's before ``key_table`` too):
Lua makes a closure of every ``local function`` a script passes, on every call, dearer the more
outer names it reads, and every table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ... import lua_loader
from ...config.fields import MAX_RATE_LIMITS
from ...errors import BackendUnavailableError
from ..lines import TURN_SAMPLE
from ..quota import TURN_EARLY
from ..release_rate import RELEASE_TAU
from ..tenant_steps import RECENT_BUCKET, RECENT_TTL_MS
from ..values import (
    BACKOFF,
    CONCURRENCY,
    GRANT_BATCH,
    KEY_RATE,
    KEY_SCAN,
    LAZY_LIMIT,
    PAUSED,
    PER_KEY,
    RATE,
    Ticket,
)
from ..windows import EPSILON
from .codec import (
    CONFLICT,
    COST_REFUSED,
    KEY_MARGIN_MS,
    RATE_EPOCH_MS,
    RATE_KEEP_MS,
    RATE_UNIT,
    SETTLED,
    UNKNOWN,
    RedisKeys,
    cost_arg,
)
from .wire import HotPath, bulk

#: The modules a full decision needs, in the order they are sent (each needs those before it).
DECIDING = ("keys", "key_table", "state", "windows", "slot_records", "key_rules", "busy",
            "key_windows", "quota", "lines", "grants", "tenants", "queue_state")
#: Each operation script and the modules sent before it, in order; only these are sent.
SCRIPTS: dict[str, tuple[str, ...]] = {
    "admit": ("keys", "windows", "admit_fast", "key_table", "state", "slot_records", "key_rules",
              "busy", "key_windows", "quota", "lines", "grants", "tenants", "queue_state"),
    "release": ("release_fast", "keys", "key_table", "state", "windows", "slot_records",
                "key_rules", "busy", "key_windows", "quota", "lines", "grants", "tenants",
                "queue_state"),
    "withdraw": DECIDING,
    "heartbeat": ("keys", "key_table", "state", "slot_records", "key_rules", "busy"),
    "reclaim": ("keys", "key_table", "state", "reclaim_fast", "windows", "slot_records",
                "key_rules", "busy", "key_windows", "quota", "lines", "grants", "tenants",
                "queue_state"),
    "register": (*DECIDING, "key_settings"),
    "register_keys": (*DECIDING, "key_settings"),
    "unregister": ("keys", "key_table", "state", "windows", "key_rules", "key_windows",
                   "slot_records", "lines"),
    "set_capacity": DECIDING,
    "set_max_hold": ("keys", "key_table", "state"),
    "stats": ("keys", "key_table", "state", "windows", "key_rules", "key_windows", "quota"),
    "waiters": ("keys", "key_table", "state", "slot_records", "key_rules", "lines", "reads"),
    "place": ("keys", "key_table", "state", "slot_records", "key_rules", "lines", "reads"),
    "release_rate": ("keys", "key_table", "state"),
    "busy_slots": ("keys", "key_table", "slot_records"),
    "pending_grants": ("keys", "key_table", "state", "slot_records", "grants"),
    "restore": ("keys", "key_table", "state", "windows", "key_rules", "key_windows", "quota",
                "slot_records", "busy", "lines", "key_settings"),
    "settle": (*DECIDING, "settling"),
    "backoff": ("keys", "key_table", "state", "windows", "key_rules", "key_windows", "quota"),
    "set_rate_limit": ("keys", "key_table", "state", "windows", "key_rules", "key_windows",
                       "quota"),
    "set_key": (*DECIDING, "key_settings"),
    "pause": ("keys", "key_table", "state"),
    "resume": (*DECIDING,),
    "key_stats": (*DECIDING,),
    "would_refuse": ("keys", "key_table", "state", "slot_records", "key_rules", "lines",
                     "tenants"),
}
#: The figures the scripts share with Python, sent at the top of each as ``C_<NAME>``.
CONSTANTS: dict[str, lua_loader.Constant] = {
    "UNKNOWN": UNKNOWN, "COST_REFUSED": COST_REFUSED, "SETTLED": SETTLED, "CONFLICT": CONFLICT,
    "GRANT_BATCH": GRANT_BATCH, "KEY_SCAN": KEY_SCAN, "TURN_SAMPLE": TURN_SAMPLE,
    "TURN_EARLY": TURN_EARLY, "EPSILON": EPSILON, "KEY_MARGIN_MS": KEY_MARGIN_MS,
    "MAX_RATE_LIMITS": MAX_RATE_LIMITS, "RELEASE_TAU": RELEASE_TAU, "RATE_EPOCH_MS": RATE_EPOCH_MS,
    "RATE_UNIT": RATE_UNIT, "RATE_KEEP_MS": RATE_KEEP_MS,
    "RATE": RATE, "KEY_RATE": KEY_RATE, "CONCURRENCY": CONCURRENCY, "PER_KEY": PER_KEY,
    "BACKOFF": BACKOFF, "PAUSED": PAUSED, "RECENT_BUCKET": RECENT_BUCKET,
    "RECENT_TTL_MS": RECENT_TTL_MS,
}
_LAZY_LIMIT_BULK = bulk(LAZY_LIMIT)


def script_source(name: str) -> str:
    """The script sent for method *name*: :data:`CONSTANTS`, its modules, ``lua/<name>.lua``."""
    return lua_loader.compose(__package__, name, SCRIPTS[name], CONSTANTS)


class Scripts:
    """The scripts of one backend, registered on *client*, and how to call them.

    *redis* is the redis-py module, *common* ARGV[1..4] (the same for every call of the
    backend), *clock* the backend's (``None``: the scripts read Redis ``TIME``), *cluster*
    whether *client* is a ``RedisCluster`` (no hot path and no pipelined EVALSHA there).
    """

    def __init__(self, client: Any, redis: Any, rkeys: RedisKeys, common: tuple[str, ...],
                 clock: Callable[[], float] | None, cluster: bool) -> None:
        self.client = client
        self.redis = redis
        self.rkeys = rkeys
        self.common = common
        self.clock = clock
        self.cluster = cluster
        self.by_name = {name: client.register_script(script_source(name)) for name in SCRIPTS}
        # try_admit and release skip redis-py's command dispatch (see wire.py).
        self.hot = None if cluster else HotPath(client, redis)

    def now(self) -> str:
        """ARGV[5]: the clock in whole milliseconds, or ``""`` for the script to read TIME."""
        # The scripts read Redis TIME when no clock was given: never two clocks in one window.
        return "" if self.clock is None else str(round(self.clock() * 1000))

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Turn redis-py's errors into :class:`BackendUnavailableError`."""
        try:
            yield
        except self.redis.RedisError as exc:
            raise BackendUnavailableError(f"Redis admission backend: {exc}") from exc

    def _args(self, now: str, *args: object) -> list[object]:
        return [*self.common, now, *args]

    def run(self, name: str, queue: str, *args: object) -> Any:
        """Script *name* on *queue* with *args* after NOW; its reply."""
        rkey = self.rkeys.cfg(queue)
        with self.guard():
            return self.by_name[name]([rkey], self._args(self.now(), *args))

    def run_hot(self, name: str, queue: str, *args: str | int) -> Any:
        """:meth:`run` through the hot path (where there is one)."""
        if self.hot is None:
            return self.run(name, queue, *args)
        rkey = self.rkeys.cfg(queue)
        try:  # not self.guard(): a context manager costs more than the rest of this method
            return self.hot(self.by_name[name], rkey, self.common, (self.now(), *args))
        except self.redis.RedisError as exc:
            raise BackendUnavailableError(f"Redis admission backend: {exc}") from exc

    def run_each(self, name: str, queues: Sequence[str], *args: object) -> list[Any]:
        """One script call per queue, pipelined, all at one *now*."""
        return self.pipelined(name, [(q, args) for q in queues])

    def pipelined(self, name: str, calls: Sequence[tuple[str, Sequence[object]]]) -> list[Any]:
        """Script *name* once per ``(queue, args)``, in one pipeline, all at one *now*."""
        if not calls:
            return []
        now = self.now()
        script = self.by_name[name]
        with self.guard():
            if self.cluster:
                # redis-py refuses EVALSHA in a cluster pipeline: one call per queue instead.
                return [script([self.rkeys.cfg(q)], self._args(now, *a)) for q, a in calls]
            results = self._send(script, now, calls)
            again = [i for i, r in enumerate(results) if isinstance(r, self.redis.exceptions.NoScriptError)]
            if again:
                # The server forgot the script (a restart, SCRIPT FLUSH): only the calls it
                # refused are sent again, so none is asked twice.
                script.sha = self.client.script_load(script.script)
                for i, r in zip(again, self._send(script, now, [calls[i] for i in again]), strict=True):
                    results[i] = r
            for r in results:
                if isinstance(r, Exception):
                    raise r
            return list(results)

    def _send(self, script: Any, now: str, calls: Sequence[tuple[str, Sequence[object]]]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for q, a in calls:
            pipe.evalsha(script.sha, 1, self.rkeys.cfg(q), *self._args(now, *a))
        return list(pipe.execute(raise_on_error=False))

    # -- RESP bytes for the event loop --------------------------------------------------------
    def admit_command(self, t: Ticket) -> bytes:
        """admit.lua's ``EVALSHA`` for *t* as RESP bytes, NOW then :func:`.codec.admit_args`,
        at one format: every admission on the event loop sends one (keep the two in step)."""
        assert self.hot is not None  # only LoopCalls calls it
        head = self.hot.head(self.by_name["admit"], self.rkeys.cfg(t.queue), self.common, 8)
        now, tid, inst = self.now().encode(), t.task_id.encode(), t.instance.encode()
        prio, key, label = b"%d" % t.priority, t.fairness_key.encode(), t.label.encode()
        cost = cost_arg(t.cost).encode()
        return b"%s$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n%s$%d\r\n%s\r\n" % (
            head, len(now), now, len(tid), tid, len(inst), inst, len(prio), prio, len(key), key,
            len(label), label, _LAZY_LIMIT_BULK, len(cost), cost)

    def release_command(self, queue: str, slot_id: str) -> bytes:
        """release.lua's ``EVALSHA`` for *slot_id* of *queue* as RESP bytes (see
        :meth:`admit_command`)."""
        assert self.hot is not None
        head = self.hot.head(self.by_name["release"], self.rkeys.cfg(queue), self.common, 2)
        now, slot = self.now().encode(), slot_id.encode()
        return b"%s$%d\r\n%s\r\n$%d\r\n%s\r\n" % (head, len(now), now, len(slot), slot)

    def load(self, script: Any) -> None:
        """Teach the server *script* again (after a NOSCRIPT reply; same text, same sha)."""
        self.client.script_load(script.script)

    def close(self) -> None:
        """Give the hot path's idle connections back to the pool."""
        if self.hot is not None:
            self.hot.close()
