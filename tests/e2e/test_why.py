"""Why a task waits, on real prefork workers: the PARKED state and ``why`` from every place.

* ``flowcontrol_track_parked``: a task parked behind a cap-1 queue is ``PARKED`` in the result
  backend (Redis, and the database backend on SQLite and PostgreSQL), with its queue, reason,
  retry_at and parked_at, set once its row is committed; then it runs and ends SUCCESS as
  usual (STARTED on the way with ``task_track_started``); one that expires or is revoked while
  parked ends REVOKED; an ``ignore_result`` call is left alone; off (the default), a parked
  task stays PENDING.
* ``celery -A proj flowcontrol why TASK_ID``: parked (its place in line, what holds it),
  running (on its worker), lingering (asked of the workers by remote control), finished, and
  an id nobody sent (``unseen``, exit status 0); ``--json`` is ``explain``'s dict.
* The explained places are the order in which the parked tasks then start.
* Each reason reached on a worker is explained, and PARKED with it: ``concurrency``, ``rate``,
  ``key-concurrency``, ``eta``, ``key-rate``, ``backoff``, ``debounce`` and ``batch`` (the last
  two parked by the producer), ``paused`` (a queue and a key paused by ``pause(..., until=)``
  on the Redis backend, whose pause and until when, then resumed and run, in queues with and
  without a cap: a rate-only queue, and a key of a rate-only keyed queue) and ``grant`` (a slot
  freed while the worker is stopped).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from celery_flowcontrol import FlowControl, backoff, explain, pause, resume
from celery_flowcontrol.admission import Ticket
from tests.support.fixtures import MakeHarness
from tests.support.harness import REPO, Harness, wait_for
from tests.support.projects.base import revocations


def why(h: Harness, task_id: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A proj flowcontrol why TASK_ID`` in the project's directory."""
    env = {**os.environ, **h.env, "PYTHONPATH": os.pathsep.join([str(h.workdir), str(REPO)])}
    return subprocess.run(  # noqa: S603 - our interpreter, our arguments
        [sys.executable, "-m", "tests.support.celery_command", "-A", "proj", "flowcontrol", "why", task_id,
         *args],
        cwd=h.workdir, env=env, capture_output=True, text=True, timeout=60, check=False)


def why_json(h: Harness, task_id: str) -> dict[str, Any]:
    result = why(h, task_id, "--json")
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout)
    return out


@pytest.mark.parametrize("results", ["redis", "database"])
@pytest.mark.timeout(120)
def test_a_parked_task_is_parked_in_the_result_backend_and_why_says_where(
        make_harness: MakeHarness, results: str, tmp_path: Any) -> None:
    backend: bool | str = True if results == "redis" else f"db+sqlite:///{tmp_path / 'results.db'}"
    h = make_harness(results=backend, conf={
        "flowcontrol_track_parked": True, "task_track_started": True,
        "flowcontrol_queues": [{"name": "why", "concurrency": 1, "retry": "30s"}]})
    h.start_worker(2)
    running = h.send("gate", "gate0", flow_queue="why")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the gate task to hold the one slot")
    first = h.send("work", "first", flow_queue="why")
    second = h.send("work", "second", flow_queue="why")
    quiet = h.send("work", "quiet", flow_queue="why", ignore_result=True)
    wait_for(lambda: h.parked("why") == 3, 20, what="the three tasks to be parked")
    wait_for(lambda: h.app.AsyncResult(second).state == "PARKED", 20, what="the PARKED state")
    meta = h.app.AsyncResult(first).info
    assert h.app.AsyncResult(first).state == "PARKED"
    assert meta["queue"] == "why" and meta["reason"] == "concurrency"
    assert meta["retry_at"] > meta["parked_at"] > 0

    out = why_json(h, second)
    assert out["where"] == "parked" and out["reason"] == "concurrency"
    assert (out["position"], out["waiting"]) == (2, 3)
    (busy,) = out["blocked_by"]
    assert (busy["busy"], busy["capacity"]) == (1, 1) and len(busy["holders"]) == 1
    text = why(h, second)
    assert text.returncode == 0
    assert text.stdout.strip() == f"task {second} is parked in queue why, 2nd of 3: 1 of 1 slots busy"
    assert explain(h.app, first)["position"] == 1
    assert h.app.AsyncResult(quiet).state == "PENDING"  # ignore_result: left alone
    assert why_json(h, running)["where"] == "running"
    assert h.app.AsyncResult(running).state == "STARTED"

    h.gauge.open_gate()
    h.wait_done(["gate0", "first", "second", "quiet"], timeout=40)
    starts = {e.label: e.start for e in h.gauge.executions()}
    assert starts["first"] < starts["second"] < starts["quiet"]  # the explained places
    assert h.app.AsyncResult(second).get(timeout=10) == "second"
    done = why(h, second)
    assert done.stdout.strip() == f"task {second} finished: SUCCESS"


@pytest.mark.parametrize("results", ["sqlite", "postgresql"])
@pytest.mark.timeout(120)
def test_on_the_database_backend_parked_then_started_or_its_true_ending(
        make_harness: MakeHarness, request: pytest.FixtureRequest, results: str, tmp_path: Any) -> None:
    url = (f"db+sqlite:///{tmp_path / 'results.db'}" if results == "sqlite"
           else "db+" + request.getfixturevalue("postgres_url"))
    h = make_harness(results=url, conf={
        "flowcontrol_track_parked": True, "task_track_started": True,
        "flowcontrol_queues": [{"name": "why", "concurrency": 1, "retry": "30s"}]})
    h.app.backend  # noqa: B018 - the client creates the result tables before a worker races to
    h.start_worker(2)
    h.send("gate", "gate0", flow_queue="why")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the gate task to hold the one slot")
    runs = h.send("work", "runs", 2.0, flow_queue="why")  # long enough to be seen STARTED
    expiring = h.send("work", "expiring", flow_queue="why", expires=6)
    revoked = h.send("work", "revoked", flow_queue="why")
    wait_for(lambda: h.parked("why") == 3, 20, what="the three tasks to be parked")
    for task_id in (runs, expiring, revoked):
        wait_for(lambda t=task_id: h.app.AsyncResult(t).state == "PARKED", 20, what="PARKED")
        meta = h.app.AsyncResult(task_id).info
        assert (meta["queue"], meta["reason"]) == ("why", "concurrency")
        assert meta["retry_at"] > meta["parked_at"] > 0
    h.app.control.revoke(revoked)
    # Its row wakes at its expiry (before the 30 s retry), and the worker revokes it.
    wait_for(lambda: h.app.AsyncResult(expiring).state == "REVOKED", 30, what="the expiry")
    h.gauge.open_gate()
    wait_for(lambda: h.app.AsyncResult(runs).state == "STARTED", 30, what="the parked task to start")
    assert h.app.AsyncResult(runs).get(timeout=30) == "runs"
    # Its grant passes to the revoked one, woken and revoked by the worker.
    wait_for(lambda: h.app.AsyncResult(revoked).state == "REVOKED", 30, what="the revocation")
    assert explain(h.app, revoked)["where"] == "finished"
    assert not {"expiring", "revoked"} & set(h.gauge.done())
    assert revocations(h.gauge)[expiring]["expired"] is True
    assert h.parked("why") == 0


@pytest.mark.timeout(90)
def test_untracked_a_parked_task_stays_pending(make_harness: MakeHarness) -> None:
    h = make_harness(results=True, conf={
        "flowcontrol_queues": [{"name": "why", "concurrency": 1, "retry": "30s"}]})
    h.start_worker(2)
    h.send("gate", "gate0", flow_queue="why")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the gate task to hold the one slot")
    parked = h.send("work", "p", flow_queue="why")
    wait_for(lambda: h.parked("why") == 1, 20, what="the task to be parked")
    assert h.app.AsyncResult(parked).state == "PENDING"  # flowcontrol_track_parked is off
    assert explain(h.app, parked)["where"] == "parked"  # and why still answers
    h.gauge.open_gate()
    h.wait_done(["gate0", "p"], timeout=30)


@pytest.mark.timeout(90)
def test_unseen_and_lingering_come_from_the_workers(make_harness: MakeHarness) -> None:
    h = make_harness(conf={"flowcontrol_linger": "60s",
                           "flowcontrol_queues": [{"name": "why", "concurrency": 1}]})
    h.start_worker(2)
    nobody = why(h, "never-sent-anywhere")
    assert nobody.returncode == 0 and "unseen" in nobody.stdout
    h.send("gate", "gate0", flow_queue="why")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the gate task to hold the one slot")
    lingering = h.send("work", "l", flow_queue="why")
    wait_for(lambda: explain(h.app, lingering, timeout=1.0)["where"] == "lingering", 20,
             what="the denied task to linger on the worker")
    out = why_json(h, lingering)
    assert out["worker"].startswith(f"{h.prefix}-w1@") and out["queue"] == "why"
    assert (out["position"], out["reason"]) == (1, "concurrency")
    assert out["text"].startswith(f"task {lingering} is lingering on {out['worker']} in queue why, 1st of 1")
    h.gauge.open_gate()
    h.wait_done(["gate0", "l"], timeout=30)


@pytest.mark.timeout(120)
def test_each_reason_reached_on_a_worker_is_explained(make_harness: MakeHarness) -> None:
    h = make_harness(results=True, conf={
        "flowcontrol_track_parked": True, "flowcontrol_linger": 0,
        "flowcontrol_queues": [{"name": "slow", "rate_limit": "1/m"},
                               {"name": "tenants", "concurrency": 4, "per_key_concurrency": 1,
                                "retry": "30s"},
                               {"name": "later", "concurrency": 4}]})
    h.start_worker(2)
    h.send("work", "r0", flow_queue="slow")
    rated = h.send("work", "r1", flow_queue="slow")
    h.send("gate", "g0", flow_queue="tenants", fairness_key="acme")
    wait_for(lambda: h.gauge.started() >= 1, 20, what="a task of acme to hold its key's slot")
    keyed = h.send("work", "k1", flow_queue="tenants", fairness_key="acme")
    eta = h.send("work", "e1", flow_queue="later", countdown=60)
    wait_for(lambda: h.parked() == 3, 30, what="the three waiting tasks to be parked")
    expected = {rated: "rate", keyed: "key-concurrency", eta: "eta"}
    for task_id, reason in expected.items():
        out = explain(h.app, task_id)
        assert (out["where"], out["reason"]) == ("parked", reason), out
        wait_for(lambda t=task_id: h.app.AsyncResult(t).state == "PARKED", 20, what="PARKED")
        assert h.app.AsyncResult(task_id).info["reason"] == reason
    assert explain(h.app, eta)["estimated_start"] == pytest.approx(explain(h.app, eta)["retry_at"])
    assert explain(h.app, rated)["estimated_start"] is not None
    assert "key acme holds 1 of its 1 slots" in explain(h.app, keyed)["text"]
    h.gauge.open_gate()


@pytest.mark.timeout(150)
def test_key_rate_backoff_debounce_batch_and_grant_on_a_worker_are_explained(
        make_collapse: MakeHarness) -> None:
    h = make_collapse(conf={
        "flowcontrol_track_parked": True, "flowcontrol_linger": 0,
        "flowcontrol_queues": [{"name": "keyed", "per_key_rate_limit": {
                                   "limit": 1, "period": 60, "algorithm": "sliding"}},
                               {"name": "open", "rate_limit": "100/s"},
                               {"name": "held", "concurrency": 4},
                               {"name": "stop", "concurrency": 4},
                               {"name": "tenant", "concurrency": 4},
                               {"name": "one", "concurrency": 1, "retry": "60s"}]})
    node = h.start_worker(2)
    fc = FlowControl(h.app)
    until = backoff(h.app, "held", 60)
    stop_until = pause(h.app, "stop", until="60s")
    key_until = pause(h.app, "tenant", key="bigco", until="90s")
    # Queues with no cap: resuming grants no slot there.
    pause(h.app, "open", until="5m")
    pause(h.app, "keyed", key="bigco", until="5m")
    h.send("work", "k0", flow_queue="keyed", fairness_key="acme")
    wait_for(lambda: "k0" in h.gauge.done(), 20, what="acme's first call to use its window")
    keyed = h.send("work", "k1", flow_queue="keyed", fairness_key="acme")
    held = h.send("work", "b1", flow_queue="held")
    burst = h.send("work", "d1", flow_debounce="60s")
    lone = str(h.app.tasks["proj.pair"].delay(1).id)
    stopped = h.send("work", "s1", flow_queue="stop")
    bigco = h.send("work", "p1", flow_queue="tenant", fairness_key="bigco")
    opened = h.send("work", "o1", flow_queue="open")
    rated = h.send("work", "q1", flow_queue="keyed", fairness_key="bigco")
    # Eight rows, and the batch's own row (its run, due 60 s after its first call).
    wait_for(lambda: h.parked() == 9, 30, what="the eight waiting calls to be parked")
    expected = {keyed: "key-rate", held: "backoff", burst: "debounce", lone: "batch",
                stopped: "paused", bigco: "paused", opened: "paused", rated: "paused"}
    for task_id, reason in expected.items():
        out = explain(h.app, task_id)
        assert (out["where"], out["reason"]) == ("parked", reason), out
        assert out["retry_at"] is not None and out["retry_at"] > out["now"] + 30, out
        assert out["estimated_start"] == pytest.approx(out["retry_at"]), out
    for task_id in expected:  # parked by the worker, or by the producer (debounce, batch)
        wait_for(lambda t=task_id: h.app.AsyncResult(t).state == "PARKED", 20, what="PARKED")
        meta = h.app.AsyncResult(task_id).info
        assert meta["reason"] == expected[task_id]
        assert meta["retry_at"] == pytest.approx(explain(h.app, task_id)["retry_at"], abs=1.0)
    assert "key acme's rate limit is used up" in explain(h.app, keyed)["text"]
    assert {"reason": "backoff", "until": until} in explain(h.app, held)["blocked_by"]
    assert explain(h.app, burst)["text"].startswith(f"task {burst} is parked in queue ")
    assert "its batch is gathering" in explain(h.app, lone)["text"]
    # Whose pause and until when; it starts no later than the pause ends.
    for task_id, whose, end in ((stopped, None, stop_until), (bigco, "bigco", key_until)):
        out = explain(h.app, task_id)
        assert {"reason": "paused", "key": whose, "until": end} in out["blocked_by"], out
        assert out["estimated_start"] == pytest.approx(end), out
    assert "the queue is paused; about " in explain(h.app, stopped)["text"]
    assert "key bigco is paused; about " in explain(h.app, bigco)["text"]
    # Resumed, the parked calls are granted slots of their queues (both have a cap), which
    # wake them well before their pauses would have ended.
    resume(h.app, "stop")
    resume(h.app, "tenant", key="bigco")
    assert h.app.AsyncResult(stopped).get(timeout=30) == "s1"  # resumed: it runs
    assert h.app.AsyncResult(bigco).get(timeout=30) == "p1"
    # Queues with no cap: their parked calls are made due by resume, and the next poll wakes
    # them, minutes before their pauses would have ended.
    resume(h.app, "open")
    resume(h.app, "keyed", key="bigco")
    assert h.app.AsyncResult(opened).get(timeout=30) == "o1"
    assert h.app.AsyncResult(rated).get(timeout=30) == "q1"

    # A grant: the slot this test holds is freed while the worker is stopped, so the grant
    # waits for it to come back.
    slot = fc.backend.try_admit(Ticket("one", "held-by-the-test", "test/1/aa")).slot
    granted = h.send("work", "g1", flow_queue="one")
    wait_for(lambda: explain(h.app, granted)["where"] == "parked", 20, what="g1 to be parked")
    os.killpg(node.proc.pid, signal.SIGSTOP)
    try:
        fc.backend.release(slot.slot_id)
        out = explain(h.app, granted, timeout=0.2)
        assert (out["where"], out["reason"]) == ("granted", "grant"), out
        assert out["text"] == (f"task {granted} is granted in queue one: a slot is reserved "
                               "for it, its message is on its way")
    finally:
        os.killpg(node.proc.pid, signal.SIGCONT)
    assert h.app.AsyncResult(granted).get(timeout=30) == "g1"
    assert h.app.tasks["proj.pair"].delay(2).get(timeout=30) == 2  # the pair is complete
    assert h.app.AsyncResult(lone).get(timeout=10) == 1
