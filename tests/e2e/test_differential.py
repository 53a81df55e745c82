"""The gate leaves Celery's semantics alone: a differential test on real prefork workers.

The same scenarios (retries of every kind, chains, groups, chords, ``replace()``, revokes by id
and by stamped header, time limits, ``acks_on_failure_or_timeout``, ``task_track_started``) run
on three workers side by side, each in its own world (broker queue, keys, flowcontrol prefix):

* ``plain``: ordinary Celery tasks, no flow control;
* ``gated``: the same tasks, every one a FlowTask of one flow queue of capacity 50;
* ``contended``: the same again, at capacity 2, so most tasks are parked and woken.

Each scenario must end the same on all three: the states and results in the result backend,
the runs of each task (with its retry count), and the Celery signals fired in the worker
(``task_success``, ``task_failure``, ``task_retry``, ``task_revoked`` with its flags). Timing
is the one thing allowed to differ, with one more thing that is not Celery's semantics:
which pool process a STARTED task is in. The broker priority each run sees is compared (a
FlowTask is sent with plain Celery's; the order of starts in a broker queue shared with plain
tasks: test_mixed_order.py). A failure prints, per scenario, a diff of plain against the gated run. The
scenarios are checked against what plain Celery does too, so a scenario that silently does
nothing can't pass as "equal". Brokers: Redis and RabbitMQ; result backends: Redis and
PostgreSQL (SQLAlchemy, in the test's own schema).
"""

from __future__ import annotations

import difflib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import chain, chord, group
from celery.result import AsyncResult
from celery.states import READY_STATES

from tests.support.fixtures import MakeHarness
from tests.support.harness import wait_for
from tests.support.projects.differential import FLOW_QUEUE, DifferentialHarness

#: Flow queue capacity of each gated configuration; ``None``: plain Celery.
MODES: dict[str, int | None] = {"plain": None, "gated": 50, "contended": 2}
#: How long every scenario of one worker may take to end.
FINISH_TIMEOUT = 75.0
#: A denied message lingers unacked in its worker for at most this long (flowcontrol_linger's
#: default) before it is parked or runs: a message out of sight for longer is nowhere.
LINGER = 0.5
#: The events must stop changing this long before they are read (a late signal counts).
QUIET = 1.5


class Run:
    """One configuration's client side: signatures whose task ids derive from their labels."""

    def __init__(self, h: DifferentialHarness) -> None:
        self.h = h
        self.app = h.app
        self.ids: dict[str, str] = {}

    def tid(self, label: str) -> str:
        return self.ids.setdefault(label, f"{self.h.prefix}.{label}")

    def s(self, task: str, *args: Any, label: str, **options: Any) -> Any:
        """``proj.<task>.s(*args, label=label)`` with the task id ``<prefix>.<label>``."""
        sig = self.app.tasks[f"proj.{task}"].s(*args, label=label)
        return sig.set(task_id=self.tid(label), **options)

    def si(self, task: str, *args: Any, label: str) -> Any:
        return self.s(task, *args, label=label).set(immutable=True)

    def result(self, label: str) -> AsyncResult:
        return self.app.AsyncResult(self.tid(label))

    def executed(self, label: str) -> bool:
        return any(e[0] == "exec" and e[1] == label for e in self.app.recorder.events())


@dataclass
class Scenario:
    """What to send (*send*, on the client), which labels must end (*done*: ready, or the
    state given), and which states plain Celery gives (*expect*: the scenario's sanity)."""

    name: str
    send: Callable[[Run, str], None]
    done: dict[str, str | None]
    expect: dict[str, str]
    labels: list[str] = field(default_factory=list)
    #: Labels that must have run on plain Celery (the sanity of a scenario without a state).
    ran: list[str] = field(default_factory=list)
    #: Its message may outlive ``expires`` in the broker: RabbitMQ drops it by its TTL then.
    ttl: bool = False
    #: Called once every scenario is sent and the running tasks are revoked.
    then: Callable[[Run, str], None] | None = None

    def __post_init__(self) -> None:
        self.labels = sorted({*self.done, *self.expect, *self.labels})


def one(task: str, *args: Any, **options: Any) -> Callable[[Run, str], None]:
    """Send ``proj.<task>(*args)`` once, labelled with the scenario's name."""
    def send(run: Run, name: str) -> None:
        run.s(task, *args, label=name, **options).apply_async()
    return send


def send_chain_fail(run: Run, name: str) -> None:
    chain(run.s("add", 1, 2, label=f"{name}.1"), run.s("fail", label=f"{name}.2"),
          run.s("add", 1, label=f"{name}.3")).apply_async()


def send_chord_nested(run: Run, name: str) -> None:
    inner = chord([run.s("add", 2, 2, label=f"{name}.i1"), run.s("add", 3, 3, label=f"{name}.i2")],
                  run.s("tsum", label=f"{name}.inner"))
    chord([run.s("add", 1, 1, label=f"{name}.h1"), inner],
          run.s("tsum", label=f"{name}.body")).apply_async()


def send_revoke_waiting(run: Run, name: str) -> None:
    run.s("add", 1, 1, label=name, countdown=3).apply_async()
    run.app.control.revoke(run.tid(name))


def send_stamp_waiting(run: Run, name: str) -> None:
    sig = run.s("add", 1, 1, label=name, countdown=3)
    sig.stamp(diffstamp=f"{run.h.prefix}-{name}")
    sig.apply_async()
    run.app.control.revoke_by_stamped_headers({"diffstamp": f"{run.h.prefix}-{name}"})


def send_blocked(run: Run, name: str) -> None:
    sig = run.s("block", label=name)
    sig.stamp(diffstamp=f"{run.h.prefix}-{name}")
    sig.apply_async()


def send_errback(run: Run, name: str) -> None:
    run.s("fail", label=name).apply_async(link_error=run.s("errback", label=f"{name}.errback"))


def send_chain_group_chord(run: Run, name: str) -> None:
    # A group followed by a task in a chain: Celery makes it a chord.
    chain(run.s("add", 1, 1, label=f"{name}.1"),
          group(run.s("add", 10, label=f"{name}.g1"), run.s("add", 20, label=f"{name}.g2")),
          run.s("tsum", label=f"{name}.body")).apply_async()


def send_chord_retry(run: Run, name: str) -> None:
    chord([run.s("retrier", "countdown", label=f"{name}.1"), run.s("add", 1, 1, label=f"{name}.2")],
          run.s("collect", label=f"{name}.body")).apply_async()


def revoke_retrying(run: Run, name: str) -> None:
    """Revoke the task while its retry waits out a 3 s countdown."""
    try:
        wait_for(lambda: run.result(name).state == "RETRY", 30, 0.05, f"{name} to retry")
    except AssertionError:
        return  # never got there: the outcomes say so
    run.app.control.revoke(run.tid(name))


def revoke_running(run: Run) -> None:
    """After every scenario is sent: terminate the two blocked tasks once they run, one by
    task id, one by its stamped header."""
    for name in ("revoke_running", "stamp_running"):
        try:
            wait_for(lambda n=name: run.executed(n), 30, 0.1, f"{name} to start")
        except AssertionError:
            pass  # never ran: the outcomes say so, beside plain Celery's
    # The pool child runs it; the main process learns so a moment later (active_requests).
    time.sleep(0.5)
    run.app.control.revoke(run.tid("revoke_running"), terminate=True)
    run.app.control.revoke_by_stamped_headers({"diffstamp": f"{run.h.prefix}-stamp_running"},
                                              terminate=True)


def chain_of(*steps: tuple[str, tuple[Any, ...]]) -> Callable[[Run, str], None]:
    def send(run: Run, name: str) -> None:
        chain(*(run.s(task, *args, label=f"{name}.{i}") for i, (task, args) in
                enumerate(steps, 1))).apply_async()
    return send


def group_of(*steps: tuple[str, tuple[Any, ...]]) -> Callable[[Run, str], None]:
    def send(run: Run, name: str) -> None:
        group(run.s(task, *args, label=f"{name}.{i}") for i, (task, args) in
              enumerate(steps, 1)).apply_async()
    return send


def chord_of(*steps: tuple[str, tuple[Any, ...]]) -> Callable[[Run, str], None]:
    def send(run: Run, name: str) -> None:
        chord([run.s(task, *args, label=f"{name}.{i}") for i, (task, args) in
               enumerate(steps, 1)], run.s("tsum", label=f"{name}.body")).apply_async()
    return send


S, F, R = "SUCCESS", "FAILURE", "REVOKED"
ADD, FAIL = "add", "fail"

SCENARIOS = [
    # Due after they expire (first, so that a plain worker on RabbitMQ consumes them before
    # their broker TTL passes, as it usually does).
    Scenario("expires_waiting", one("add", 1, 2, countdown=2, expires=1),
             {"expires_waiting": None}, {"expires_waiting": R}, ttl=True),
    Scenario("retry_expires_passes", one("retrier", "expires_passes"),
             {"retry_expires_passes": None}, {"retry_expires_passes": R}, ttl=True),
    # The two blocked tasks first: at capacity 2 they hold both slots until revoked.
    Scenario("revoke_running", send_blocked, {"revoke_running": None}, {"revoke_running": R}),
    Scenario("stamp_running", send_blocked, {"stamp_running": None}, {"stamp_running": R}),
    Scenario("retry_countdown", one("retrier", "countdown"), {"retry_countdown": None},
             {"retry_countdown": S}),
    Scenario("retry_eta", one("retrier", "eta"), {"retry_eta": None}, {"retry_eta": S}),
    Scenario("retry_max", one("retrier", "max"), {"retry_max": None}, {"retry_max": F}),
    Scenario("retry_max_exc", one("retrier", "max_exc"), {"retry_max_exc": None},
             {"retry_max_exc": F}),
    Scenario("retry_expires", one("retrier", "expires"), {"retry_expires": None},
             {"retry_expires": S}),
    Scenario("retry_priority_headers", one("retrier", "priority_headers"),
             {"retry_priority_headers": None}, {"retry_priority_headers": S}),
    Scenario("autoretry", one("auto", 2), {"autoretry": None}, {"autoretry": S}),
    Scenario("autoretry_exhausted", one("auto", 9), {"autoretry_exhausted": None},
             {"autoretry_exhausted": F}),
    Scenario("chain_ok", chain_of((ADD, (1, 2)), (ADD, (3,)), (ADD, (4,))), {"chain_ok.3": None},
             {"chain_ok.1": S, "chain_ok.2": S, "chain_ok.3": S}),
    Scenario("chain_fail", send_chain_fail, {"chain_fail.2": None, "chain_fail.3": None},
             {"chain_fail.1": S, "chain_fail.2": F, "chain_fail.3": F}),
    Scenario("group_ok", group_of(*((ADD, (i, i)) for i in range(4))),
             {f"group_ok.{i}": None for i in range(1, 5)}, {f"group_ok.{i}": S for i in range(1, 5)}),
    Scenario("group_fail", group_of((ADD, (1, 1)), (FAIL, ()), (ADD, (2, 2))),
             {f"group_fail.{i}": None for i in range(1, 4)},
             {"group_fail.1": S, "group_fail.2": F, "group_fail.3": S}),
    Scenario("chord_ok", chord_of(*((ADD, (i, i)) for i in range(3))), {"chord_ok.body": None},
             {"chord_ok.body": S, "chord_ok.1": S}),
    Scenario("chord_nested", send_chord_nested, {"chord_nested.body": None},
             {"chord_nested.body": S, "chord_nested.inner": S}),
    Scenario("chord_fail", chord_of((ADD, (1, 1)), (FAIL, ()), (ADD, (2, 2))),
             {"chord_fail.body": None}, {"chord_fail.body": F, "chord_fail.2": F}),
    Scenario("replace_one", one("replacer", "one"), {"replace_one": S}, {"replace_one": S}),
    Scenario("replace_chain", one("replacer", "chain"), {"replace_chain": S},
             {"replace_chain": S}),
    Scenario("revoke_waiting", send_revoke_waiting, {"revoke_waiting": None},
             {"revoke_waiting": R}),
    Scenario("stamp_waiting", send_stamp_waiting, {"stamp_waiting": None}, {"stamp_waiting": R}),
    Scenario("soft_caught", one("soft", True), {"soft_caught": None}, {"soft_caught": S}),
    Scenario("soft_raised", one("soft", False), {"soft_raised": None}, {"soft_raised": F}),
    Scenario("hard", one("hard"), {"hard": None}, {"hard": F}),
    # acks_on_failure_or_timeout=False: the timed-out message is requeued and runs again.
    Scenario("hard_requeued", one("hard_once"), {"hard_requeued": S}, {"hard_requeued": S}),
    Scenario("fail_noack", one("fail_noack"), {"fail_noack": None}, {"fail_noack": F}),
    Scenario("track_started", one("started"), {"track_started": None}, {"track_started": S}),
    Scenario("countdown_ok", one("add", 2, 2, countdown=1), {"countdown_ok": None},
             {"countdown_ok": S}),
    Scenario("errback", send_errback, {"errback.errback": None},
             {"errback": F, "errback.errback": S}),
    Scenario("chain_group_chord", send_chain_group_chord, {"chain_group_chord.body": None},
             {"chain_group_chord.body": S, "chain_group_chord.g2": S}),
    Scenario("chord_retry", send_chord_retry, {"chord_retry.body": None},
             {"chord_retry.body": S, "chord_retry.1": S}),
    Scenario("revoke_retrying", one("retrier", "long_countdown"), {"revoke_retrying": None},
             {"revoke_retrying": R}, then=revoke_retrying),
    Scenario("reject", one("fate", "reject"), {"reject": None}, {"reject": F}),
    # Ignore leaves the task's state as it was: STARTED (task_track_started).
    Scenario("ignore", one("fate", "ignore"), {"ignore": "STARTED"}, {"ignore": "STARTED"}),
    # reject_on_worker_lost: the message is requeued and the task runs again.
    Scenario("worker_lost", one("fate", "exit"), {"worker_lost": S}, {"worker_lost": S}),
]


# -- one configuration ---------------------------------------------------------------------


def outcome_text(res: AsyncResult) -> tuple[str, str]:
    state = res.state
    value = res.result
    if isinstance(value, BaseException):
        return state, f"{type(value).__name__}: {value}"
    if state == "STARTED" and isinstance(value, dict):
        value = {**value, "pid": "<a pool process>"}  # which one took it is not semantics
    return state, repr(value)


def finished(run: Run, scenario: Scenario) -> bool:
    for label, state in scenario.done.items():
        now = run.result(label).state
        if (now != state) if state else (now not in READY_STATES):
            return False
    return True


def nowhere(run: Run, labels: list[str]) -> bool:
    """True when no message of *labels* is left to end them (RabbitMQ drops a message whose
    TTL passes in the queue): the queue holds no message ready, no row of them is parked, and
    the worker holds no request or timer entry of theirs."""
    h = run.h
    with run.app.connection_for_write() as conn:
        ready = conn.default_channel.queue_declare(h.queue_name, passive=True).message_count
    if ready:
        return False
    ids = {run.tid(label) for label in labels}
    if h.flow and any(h.store().get(tid) is not None for tid in ids):
        return False
    node = f"{h.prefix}-{h.nodes[0].name}@{socket.gethostname()}"
    inspect = run.app.control.inspect(destination=[node], timeout=5, limit=1)
    held = [inspect.query_task(*ids), inspect.scheduled()]
    if any(reply is None for reply in held):
        return False  # no answer: nothing is known
    text = json.dumps(held, default=str)
    return not any(tid in text for tid in ids)


def drive(run: Run, broker: str) -> dict[str, Any]:
    """Send every scenario, wait until each has ended (or the timeout), read the outcomes.

    On RabbitMQ a *ttl* scenario's message may be dropped by the broker: no worker ever ends
    it. Once every other scenario has ended, such a scenario has ended too when its message
    is :func:`nowhere`, twice, further apart than a message may linger out of sight."""
    for scenario in SCENARIOS:
        scenario.send(run, scenario.name)
    revoke_running(run)
    for scenario in SCENARIOS:
        if scenario.then is not None:
            scenario.then(run, scenario.name)
    recorder = run.app.recorder
    deadline = time.monotonic() + FINISH_TIMEOUT
    pending = list(SCENARIOS)
    gone_since: float | None = None
    while pending and time.monotonic() < deadline:
        pending = [s for s in pending if not finished(run, s)]
        if pending and broker == "rabbitmq" and all(s.ttl for s in pending):
            if not nowhere(run, [label for s in pending for label in s.done]):
                gone_since = None
            elif gone_since is None:
                gone_since = time.monotonic()
            elif time.monotonic() - gone_since > LINGER:
                break
        time.sleep(0.2)
    # Quiet: nothing recorded for a while (a signal of the last step still counts).
    last, still = -1, time.monotonic()
    while time.monotonic() - still < QUIET and time.monotonic() < deadline + 10:
        n = len(recorder.events())
        if n != last:
            last, still = n, time.monotonic()
        time.sleep(0.2)
    return snapshot(run)


def snapshot(run: Run) -> dict[str, Any]:
    """Per scenario: the states and results of its labelled tasks, the runs and the signals."""
    prefix = run.h.prefix
    events = run.app.recorder.events()
    out: dict[str, Any] = {}
    for scenario in SCENARIOS:
        mine = [e for e in events if str(e[1]).split(".")[0] == scenario.name]
        states = {label: list(outcome_text(run.result(label))) for label in scenario.labels}
        out[scenario.name] = json.loads(json.dumps({
            "states": states,
            "runs": sorted(e[1:] for e in mine if e[0] == "exec"),
            "signals": sorted(e for e in mine if e[0] != "exec"),
        }).replace(prefix, "P"))
    return out


def run_mode(make_harness: MakeHarness, broker: str, result_backend: str,
             capacity: int | None) -> DifferentialHarness:
    conf = {"flowcontrol_queues": [{"name": FLOW_QUEUE, "concurrency": capacity}]} if capacity else {}
    return make_harness(DifferentialHarness, broker=broker, conf=conf, flow=capacity is not None,
                        results=result_backend)


def as_delivered(outcome: dict[str, Any], label: str) -> dict[str, Any]:
    """A *ttl* scenario's outcome, had the broker delivered its message in time.

    RabbitMQ enforces ``expires`` as the message's TTL too (Celery sets ``expiration``): a
    message still in the broker when it passes is dropped, and the task stays PENDING (or
    RETRY) with no signal, while one the worker already holds ends REVOKED (expired). Which
    one plain Celery does depends on how long the message waited behind others, and a
    gated one may be dropped the same way: under contention a gated worker takes messages
    off the broker more slowly than plain Celery does (held waiters fill its prefetch
    window: docs/worker.md, "A flood"), so a short TTL lapses there more often. Every side is held to the
    delivered ending; what a worker took must then never be lost (the test checks the
    parking and dead-letter tables)."""
    if outcome["states"][label][0] not in ("PENDING", "RETRY") or any(
            e[0] == "task_revoked" for e in outcome["signals"]):
        return outcome
    return {**outcome, "states": {**outcome["states"], label: ["REVOKED", "TaskRevokedError: expired"]},
            "signals": sorted([*outcome["signals"], ["task_revoked", label, False, True, "None"]])}


def diff(plain: dict[str, Any], other: dict[str, Any], mode: str) -> list[str]:
    """A unified diff per scenario whose outcome differs."""
    out = []
    for name in plain:
        if plain[name] != other[name]:
            a = json.dumps(plain[name], indent=1, sort_keys=True).splitlines()
            b = json.dumps(other[name], indent=1, sort_keys=True).splitlines()
            out.append(f"--- {name}: plain vs {mode}\n" + "\n".join(
                difflib.unified_diff(a, b, "plain", mode, lineterm="", n=2)))
    return out


# -- the test --------------------------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("broker", "backend"), [("redis", "redis"), ("redis", "db"),
                                                 ("rabbitmq", "redis")])
@pytest.mark.gated()
def test_gated_tasks_end_as_plain_celery_tasks(make_harness: MakeHarness,
                                               request: pytest.FixtureRequest, redis_url: str,
                                               broker: str, backend: str) -> None:
    result_backend = redis_url if backend == "redis" else \
        "db+" + request.getfixturevalue("postgres_url")
    worlds = {mode: run_mode(make_harness, broker, result_backend, capacity)
              for mode, capacity in MODES.items()}
    runs = {mode: Run(h) for mode, h in worlds.items()}
    try:
        for run in runs.values():
            # The client creates the result tables (db backend) before any worker races to.
            run.app.backend  # noqa: B018
        nodes = [h.start_worker(4, wait=False) for h in worlds.values()]
        for h, node in zip(worlds.values(), nodes, strict=True):
            h.wait_ready(node, timeout=60)

        outcomes: dict[str, dict[str, Any]] = {}
        errors: dict[str, BaseException] = {}

        def one_mode(mode: str) -> None:
            try:
                outcomes[mode] = drive(runs[mode], broker)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
                errors[mode] = exc

        threads = [threading.Thread(target=one_mode, args=(m,)) for m in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise next(iter(errors.values()))

        plain = outcomes["plain"]
        if broker == "rabbitmq":
            # The broker's own drop, before any worker saw the message, is the same on every
            # side (see as_delivered). Gated, what a worker took is never lost: no row is left
            # parked or dead-lettered (so a drop is not a woken row lost on its way back).
            for mode, h in worlds.items():
                outcomes[mode] = {s.name: as_delivered(outcomes[mode][s.name], s.name)
                                  if s.ttl else outcomes[mode][s.name] for s in SCENARIOS}
                if h.flow:
                    assert h.parked() == 0 and h.store().dead_letters() == [], mode
            plain = outcomes["plain"]
        wrong = {f"{s.name}/{label}": (plain[s.name]["states"][label][0], state)
                 for s in SCENARIOS for label, state in s.expect.items()
                 if plain[s.name]["states"][label][0] != state}
        wrong.update({f"{s.name}/{label}": ("not run", "run") for s in SCENARIOS for label in s.ran
                      if label not in {r[0] for r in plain[s.name]["runs"]}})
        assert not wrong, f"plain Celery did not end as the scenarios expect (got, expected): {wrong}"
        differences = [d for mode in ("gated", "contended")
                       for d in diff(plain, outcomes[mode], mode)]
        assert not differences, (f"{len(differences)} scenario outcome(s) differ from plain "
                                 f"Celery ({broker} broker, {backend} backend):\n"
                                 + "\n".join(differences))
    finally:
        for h in worlds.values():
            h.gauge.client.set(f"{h.prefix}:diff:flag:release:revoke_running", 1)
            h.gauge.client.set(f"{h.prefix}:diff:flag:release:stamp_running", 1)
        for h, run in zip(worlds.values(), runs.values(), strict=True):
            if broker == "rabbitmq":  # make_harness deletes Redis keys, not this queue
                with run.app.connection_for_write() as conn:
                    conn.default_channel.queue_delete(h.queue_name)
            run.app.close()
