"""The chaos scenarios' project: :mod:`tests.support.projects.base` plus one measured task on one clock,
and the faults a node can be told to carry by environment variables.

``proj.cwork(label, seconds)``  a task measured by :class:`ServerGauge`: its start and end
                                times are the gauge server's ``TIME``, so a node whose clock
                                was stepped still records true intervals
``FCT_CLOCK_STEP``              seconds (``+30``, ``-30``) this node's clock jumps by ...
``FCT_CLOCK_STEP_AT``           ... at this epoch (true time): ``time.time`` of the whole node
                                process is wrapped, and the gate, waker and parking store are
                                given the wrapped clock when the worker is ready (their default
                                clocks were bound at import, before the wrap)
``FLOWCONTROL_CRASH_AT``        as the package reads it (worker/crashpoints.py); the node stamps
                                the instant it dies there (:meth:`ServerGauge.deaths`), so a run
                                cut by the kill ends when the node died, not when a test saw it
``FCT_CLAIM_LEASE``             seconds a waker's claim keeps a parked row from other wakers
                                (the parking store's ``claim_lease``, 30 s by default): what a
                                node killed between its claim and the row's delete leaves the
                                row waiting for, set on the store when the worker is ready
``FCT_STALL_LABEL``             while ``<prefix>:armed`` is set, a message whose argsrepr holds
                                this text stalls this node's consumer in the gate for 60 s, after
                                writing the node's name to ``<prefix>:stalled`` (the test kills
                                the node then: a slot granted, never confirmed)

A :class:`ChaosHarness` runs this project; :func:`chaos_harness` converts a harness made by
the e2e ``make_harness`` fixture (which still closes it).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from celery_flowcontrol.worker import crashpoints
from celery_flowcontrol.worker.runtime_registry import runtime_of
from tests.support.gauge import Execution, Gauge
from tests.support.harness import Harness, max_overlap
from tests.support.projects.base import create_app as create_base_app

#: Scenarios about parked rows under a fault wait for rows to be parked before the fault. In a
#: line that moves, a worker lets its waiters linger in its prefetch window instead (worker/linger.py)
#: and the rest stay in the broker, so few are parked: those scenarios run with lingering off.
PARKING = {"flowcontrol_linger": 0}

#: enter/exit of :class:`tests.support.gauge.Gauge`, stamped with the server's TIME.
ENTER = """
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
local n = redis.call('INCR', KEYS[1])
local peak = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > peak then redis.call('SET', KEYS[2], n) end
redis.call('RPUSH', KEYS[3], ARGV[1] .. '|' .. ARGV[2] .. '|' .. now .. '|' .. ARGV[3])
redis.call('HINCRBY', KEYS[4], ARGV[2], 1)
return n
"""
#: A node's instant of death at its crash point, on the gauge server's clock.
DIED = """
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], t[1] .. '.' .. string.format('%06d', tonumber(t[2])))
return 1
"""
EXIT = """
local t = redis.call('TIME')
local now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
redis.call('DECR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. '|' .. ARGV[2] .. '|' .. now)
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
return 1
"""


class ServerGauge(Gauge):
    """The e2e gauge with every timestamp taken from the gauge server's clock."""

    def enter(self, label: str) -> str:
        """Record the start of one execution of ``label`` (server time)."""
        client = self.client
        exec_id = uuid.uuid4().hex[:12]
        keys = [self.key("inflight"), self.key("peak"), self.key("starts"), self.key("runs")]
        client.eval(ENTER, len(keys), *keys, exec_id, label, os.environ.get("FCT_NODE", "?"))
        return exec_id

    def server_time(self) -> float:
        """Now on the gauge server's clock (the one every timestamp here is taken on)."""
        seconds, micros = self.client.time()
        return seconds + micros / 1e6

    def died(self, point: str) -> None:
        """Record that this node dies now, at crash point *point* (server time)."""
        self.client.eval(DIED, 1, self.key("deaths"), os.environ.get("FCT_NODE", "?"))

    def deaths(self) -> dict[str, float]:
        """Node -> the instant it died at its crash point (server time)."""
        return {k.decode(): float(v) for k, v in self.client.hgetall(self.key("deaths")).items()}

    def exit(self, exec_id: str, label: str) -> None:
        """Record the end of an execution (server time)."""
        keys = [self.key("inflight"), self.key("ends"), self.key("done")]
        self.client.eval(EXIT, len(keys), *keys, exec_id, label)


def _step_clock(env: Mapping[str, str]) -> Any:
    """Wrap ``time.time`` of this process so that it jumps by FCT_CLOCK_STEP at FCT_CLOCK_STEP_AT."""
    real = time.time
    step, at = float(env["FCT_CLOCK_STEP"]), float(env.get("FCT_CLOCK_STEP_AT") or 0)

    def stepped() -> float:
        now = real()
        return now + step if now >= at else now

    time.time = stepped
    return stepped


def _trace(gate: Any, store: Any) -> None:
    """Log every gate outcome and parking-table write of this node (FCT_TRACE=1; a lost
    message's trail)."""
    import logging

    log = logging.getLogger("chaos.trace")
    decide = gate.on_message

    def on_message(message: Any, task: Any, ack: Any, *rest: Any) -> Any:
        tid = (message.headers or {}).get("id")

        def traced_ack() -> Any:
            log.info("trace ack %s", tid)
            return ack()

        outcome = decide(message, task, traced_ack, *rest)  # *rest: the gate's resume
        log.info("trace gate %s %s", tid, outcome)
        return outcome

    gate.on_message = on_message
    for name in ("park", "done", "claim", "claim_due", "unclaim", "delete"):
        method = getattr(store, name)

        def wrapped(*args: Any, _m: Any = method, _n: str = name, **kwargs: Any) -> Any:
            result = _m(*args, **kwargs)
            if result is None or result == []:
                return result  # the pollers' empty claims: noise
            ids = [getattr(r, "task_id", r) for r in (result if isinstance(result, list) else [])]
            first = getattr(args[0], "task_id", args[0]) if args else ""
            log.info("trace store.%s %s -> %s", _n, first if _n != "claim_due" else "",
                     ids or result)
            return result

        setattr(store, name, wrapped)


def create_app(env: Mapping[str, str]) -> Celery:
    """The e2e app with ``proj.cwork`` and the node faults above."""
    app = create_base_app(env)
    prefix = env["FCT_PREFIX"]
    gauge = ServerGauge(env.get("FCT_GAUGE_URL", "redis://127.0.0.1:6379/0"), prefix)
    clock = _step_clock(env) if env.get("FCT_CLOCK_STEP") else None
    if env.get(crashpoints.ENV):
        crashpoints.on_crash = gauge.died  # its pool children, forked later, inherit it
    stall = env.get("FCT_STALL_LABEL")
    from celery_flowcontrol import FlowControl, FlowTask

    @worker_ready.connect(weak=False)
    def _faults(sender: Any = None, **kwargs: Any) -> None:
        fc = FlowControl(app)
        runtime = runtime_of(app)  # the worker instance's parts
        if runtime is None:
            return
        gate = runtime.gate
        if env.get("FCT_TRACE"):
            _trace(gate, fc.store)
        if env.get("FCT_CLAIM_LEASE"):
            fc.store.claim_lease = float(env["FCT_CLAIM_LEASE"])
        if clock is not None:
            gate.clock = runtime.waker.clock = fc.store.clock = clock
        if stall:
            decide = gate.on_message

            def stalling(message: Any, task: Any, ack: Any, *rest: Any) -> Any:
                if stall in str((message.headers or {}).get("argsrepr", "")) and \
                        gauge.client.get(f"{prefix}:armed"):
                    gauge.client.set(f"{prefix}:stalled", os.environ.get("FCT_NODE", "?"))
                    time.sleep(60)  # killed -9 in here
                return decide(message, task, ack, *rest)

            gate.on_message = stalling  # type: ignore[method-assign]

    @app.task(name="proj.cwork", shared=False, base=FlowTask, bind=True)
    def cwork(self: Any, label: str, seconds: float = 0.0) -> str:
        """Run for ``seconds``, measured on the gauge server's clock; the instant of admission
        (Redis TIME, where the worker hands it over) goes to the gauge's ``admitted`` list."""
        admitted = getattr(self.request, "flow_admitted_at", None)
        if admitted:
            gauge.client.rpush(gauge.key("admitted"), f"{label}|{admitted}")
        with gauge.measured(label):
            if seconds:
                time.sleep(seconds)
        return label

    return app


class ChaosHarness(Harness):
    """A :class:`Harness` whose workers and client app run this module's project."""

    project = "tests.support.projects.chaos"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.gauge.close()
        self.gauge = ServerGauge(self.gauge_url, self.prefix)
        self.ids: dict[str, str] = {}  # label -> task id, of what submit() sent

    def submit(self, queue: str, n: int, seconds: float, tag: str = "t", **options: Any) -> list[str]:
        """Send ``n`` ``proj.cwork`` tasks through flow queue ``queue``; their labels."""
        labels = [f"{tag}{i}" for i in range(n)]
        task = self.app.tasks["proj.cwork"]
        for label in labels:
            self.ids[label] = str(task.apply_async((label, seconds), flow_queue=queue, **options).id)
        return labels


def down_for(h: Harness, seconds: float, stop: Callable[[], object],
             start: Callable[[], object]) -> tuple[float, int]:
    """A fault held for *seconds*: ``stop()``, wait, ``start()``. The epoch it began at (taken
    once ``stop`` returned) and how many tasks were done by its end (counted before ``start``)."""
    stop()
    began = time.time()
    time.sleep(seconds)
    done = len(h.gauge.done())
    start()
    return began, done


def overlap_from(runs: Iterable[Execution], since: float, cut: float | None = None) -> int:
    """The most executions running at once at any instant from ``since`` on."""
    clipped = [Execution(r.exec_id, r.label, r.node, max(r.start, since), r.end) for r in runs
               if (r.end if r.end is not None else (cut if cut is not None else float("inf"))) > since]
    return max_overlap(clipped, cut)


def verdict(name: str, h: Harness, labels: Iterable[str], cap: int, *, cut: float | None = None,
            since: float = 0.0, extra: str = "") -> dict[str, Any]:
    """Count what one scenario did and print it: missing ids, duplicates, the measured peak."""
    wanted = set(labels)
    done, runs = h.gauge.done(), h.gauge.runs()
    execs = [r for r in h.gauge.executions() if r.label in wanted]
    missing = sorted(wanted - set(done))
    dups = {k: v for k, v in runs.items() if k in wanted and v > 1}
    peak = overlap_from(execs, since, cut)
    out = {"tasks": len(wanted), "completed": len(wanted) - len(missing), "missing": missing,
           "duplicates": len(dups), "extra_runs": sum(v - 1 for v in dups.values()),
           "peak": peak, "cap": cap}
    print(f"\nchaos {name}: {out['completed']}/{out['tasks']} completed, {len(missing)} missing, "
          f"{out['duplicates']} ran twice or more ({out['extra_runs']} extra runs), "
          f"peak in flight {peak} (cap {cap}){'; ' + extra if extra else ''}", flush=True)
    if peak > cap:
        print(over_cap(execs, since, cut, cap, getattr(h, "ids", {})), flush=True)
    return out


def peak_between(execs: Iterable[Execution], start: float, end: float) -> int:
    """The most executions running at once at any instant of ``[start, end)`` (each clipped
    to it; one still running ends at ``end``)."""
    return max_overlap([Execution(r.exec_id, r.label, r.node, max(r.start, start),
                                  min(r.end if r.end is not None else end, end))
                        for r in execs if r.start < end and (r.end is None or r.end > start)])


def running_at(execs: Iterable[Execution], when: float) -> int:
    """How many executions were running at the instant *when*."""
    return sum(1 for r in execs if r.start <= when and (r.end is None or r.end > when))


def over_cap(execs: list[Execution], since: float, cut: float | None, cap: int,
             ids: dict[str, str]) -> str:
    """The executions that overlapped past *cap* (label, task id, node, start and end on the
    gauge's clock, how often the label ran): where a cap breach came from."""
    def end(r: Execution) -> float:
        return r.end if r.end is not None else (cut if cut is not None else float("inf"))

    runs = sorted((r for r in execs if end(r) > since), key=lambda r: r.start)
    count: dict[str, int] = {}
    for r in runs:
        count[r.label] = count.get(r.label, 0) + 1
    culprits: set[str] = set()
    for r in runs:
        live = [o for o in runs if o.start <= r.start < end(o)]
        if len(live) > cap and r.start >= since:
            culprits.update(o.exec_id for o in live)
    return "\n".join(
        f"  over cap: {r.label} id={ids.get(r.label, '?')[:8]} node={r.node} start={r.start:.3f} "
        f"end={end(r):.3f} runs={count[r.label]}" for r in runs if r.exec_id in culprits)


def wait_all(h: Harness, labels: Iterable[str], queues: Iterable[str], timeout: float) -> None:
    """``h.wait_done``; on a timeout, print the state of each flow queue first."""
    labels = list(labels)
    try:
        h.wait_done(labels, timeout)
    except AssertionError:
        print(diagnose(h, queues))
        ids = getattr(h, "ids", {})
        for label in sorted(set(labels) - set(h.gauge.done())):
            tid = ids.get(label, "?")
            log = [line[:160] for line in h.log_text().splitlines() if tid in line][-4:]
            # in_broker reads a Redis broker's lists; on RabbitMQ nothing here can look.
            seen = h.in_broker(tid) if tid != "?" and h.broker_url.startswith("redis") else "?"
            print(f"missing {label} id={tid} in_broker={seen} "
                  f"redis={find_in_redis(h, tid) if tid != '?' else '?'} "
                  f"parked={h.store().get(tid) is not None if tid != '?' else '?'} log={log}")
        raise


def diagnose(h: Harness, queues: Iterable[str]) -> str:
    """Parked rows, busy slots, waiters and pending grants of each queue (for a failure)."""
    from celery_flowcontrol import FlowControl

    lines = []
    try:
        fc = FlowControl(h.app)
        for q in queues:
            s = fc.backend.stats(q)
            rows = [(r.task_id[:8], r.reason, round(r.wake_at - time.time(), 1), r.claimed_until)
                    for r in h.store().list(q, 20)]
            lines.append(f"queue {q}: {s}; parked {h.parked(q)}: {rows}; "
                         f"busy {[(x.slot_id, x.holder) for x in fc.backend.busy_slots(q)]}; "
                         f"waiters {[w.task_id[:8] for w in fc.backend.waiters(q, 20)]}; "
                         f"grants {fc.backend.pending_grants(q)}")
    except Exception as exc:  # noqa: BLE001 - a diagnosis must not hide the failure
        lines.append(f"(diagnosis failed: {exc!r})")
    return "\n".join(lines)


def find_in_redis(h: Harness, text: str) -> list[str]:
    """The keys of the gauge's Redis server (shared with the broker in most scenarios) whose
    value mentions ``text`` (a lost message's last trace)."""
    import redis

    client = redis.Redis.from_url(h.broker_url)
    found = []
    try:
        needle = text.encode()
        for key in client.scan_iter(count=1000):
            kind = client.type(key)
            values: list[bytes] = []
            if kind == b"list":
                values = client.lrange(key, 0, -1)
            elif kind == b"hash":
                values = [*client.hkeys(key), *client.hvals(key)]
            elif kind == b"zset":
                values = client.zrange(key, 0, -1)
            elif kind == b"string":
                values = [client.get(key) or b""]
            if any(needle in v for v in values):
                found.append(key.decode(errors="replace"))
    finally:
        client.close()
    return found
