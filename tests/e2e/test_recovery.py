"""Crashes and restarts lose nothing: a killed node's slots come back, parked tasks outlive every
process, and a message redelivered after its row was committed parks once and runs once."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone

import pytest
from kombu.serialization import dumps

from tests.support.fixtures import MakeHarness
from tests.support.harness import max_overlap, wait_for

INSTANCE_TTL = 3.0
RECLAIM_EVERY = 1.0


@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_kill9_of_a_node_holding_slots_frees_them_and_every_task_completes(make_harness: MakeHarness) -> None:
    """RabbitMQ (acks_late), cap 2, instance_ttl 3 s. The victim holds both slots with tasks
    that would run 60 s there; 10 more tasks are parked. After ``kill -9`` of the victim (main
    process and pool), the survivor runs a parked task within instance_ttl plus one reclaim
    pass (+1 s for the retry tick and republish), the cap is kept throughout, and all 12 tasks
    finish (the two killed ones are redelivered by the broker and run again)."""
    conf = {
        "flowcontrol_queues": [{"name": "k", "concurrency": 2, "retry": 0.5}],
        "flowcontrol_instance_ttl": INSTANCE_TTL,
        "flowcontrol_reclaim_interval": RECLAIM_EVERY,
    }
    h = make_harness(broker="rabbitmq", conf=conf)
    victim = h.start_worker(2, name="victim", env={"FCT_HOLD_SECONDS": "60"})
    h.send("hold", "hold0", flow_queue="k")
    h.send("hold", "hold1", flow_queue="k")
    wait_for(lambda: h.gauge.started() == 2, 20, what="both holds to start on the victim")
    h.start_worker(2, name="survivor")
    labels = [f"t{i}" for i in range(10)]
    for label in labels:
        h.send("work", label, 0.05, flow_queue="k")
    wait_for(lambda: h.parked("k") == 10, 20, what="10 tasks to be parked behind the victim's slots")
    killed_at = time.time()
    h.kill9(victim)
    done = h.wait_done([*labels, "hold0", "hold1"], timeout=40)
    runs = h.gauge.executions()
    first_parked = min(r.start for r in runs if r.label.startswith("t"))
    bound = INSTANCE_TTL + RECLAIM_EVERY + 1.0
    assert first_parked - killed_at <= bound, (
        f"first parked task started {first_parked - killed_at:.2f} s after the kill (bound {bound:g} s)"
    )
    assert max_overlap(runs, cut=killed_at) <= 2
    assert all(done[label] == 1 for label in labels)
    assert done["hold0"] == done["hold1"] == 1


@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_parked_tasks_survive_a_restart_of_every_worker_and_beat(make_harness: MakeHarness) -> None:
    """SQLite parking. Tasks parked for their ETA (5 s out) and for concurrency are in the table
    while no worker and no beat runs; after the restart each runs exactly once, none before its ETA."""
    conf = {"flowcontrol_queues": [{"name": "keep", "concurrency": 1, "retry": 2}]}
    h = make_harness(conf=conf)
    h.start_worker(2, env={"FCT_BEAT_EVERY": "1"})
    h.start_beat()
    eta = time.time() + 5
    later = [f"eta{i}" for i in range(3)]
    for label in later:
        h.send("work", label, 0.0, flow_queue="keep", eta=datetime.fromtimestamp(eta, timezone.utc))
    h.send("gate", "gate0", flow_queue="keep")
    waiters = [f"w{i}" for i in range(3)]
    for label in waiters:
        h.send("work", label, 0.0, flow_queue="keep")
    wait_for(lambda: h.parked("keep") == 6, 20, what="3 ETA tasks and 3 waiters to be parked")
    h.gauge.open_gate()  # warm shutdown waits for the running gate task: let it end
    h.stop_all()
    kept = h.parked("keep")
    assert kept >= 3, f"only {kept} parked messages left with every process stopped"
    h.start_worker(2, name="again", env={"FCT_BEAT_EVERY": "1"})
    h.start_beat("beat-again")
    done = h.wait_done([*later, *waiters, "gate0"], timeout=40)
    assert all(n == 1 for n in done.values()), done
    early = [r.label for r in h.gauge.executions() if r.label.startswith("eta") and r.start < eta]
    assert not early, f"ran before their ETA: {early}"
    assert h.parked("keep") == 0


@pytest.mark.timeout(60)
@pytest.mark.gated()
def test_a_crash_between_commit_and_ack_parks_once_and_runs_once(make_harness: MakeHarness) -> None:
    """The crash is simulated, exactly at its instant: the row is committed (here through
    ``ParkingStore.park`` directly, as the worker would have) and the broker still holds the
    message (published here with the same task id, as the broker redelivers an unacked one).
    The worker denies it again, finds the row already there, acks; the task runs once."""
    from celery_flowcontrol.parking import ParkedMessage

    conf = {"flowcontrol_queues": [{"name": "once", "concurrency": 1, "retry": "30s"}]}
    h = make_harness(conf=conf)
    h.start_worker(2)
    h.send("gate", "gate0", flow_queue="once")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the gate task to start")
    task_id = str(uuid.uuid4())
    task = h.app.tasks["proj.work"]
    message = h.app.amqp.as_task_v2(task_id, task.name, ("crashed", 0.0), {})
    headers = {**message.headers, "flow_queue": "once", "flow_priority": 0, "flow_fairness_key": task_id}
    content_type, encoding, body = dumps(message.body, serializer="json")
    h.store().park(
        ParkedMessage(
            task_id=task_id,
            queue="once",
            body=body if isinstance(body, bytes) else body.encode(),
            wake_at=time.time() + 30,
            task_name=task.name,
            fairness_key=task_id,
            content_type=content_type,
            content_encoding=encoding,
            headers=headers,
            exchange="",
            routing_key=h.queue_name,
            properties={"correlation_id": task_id, "reply_to": "", "delivery_mode": 2, "priority": 0},
        )
    )
    task.apply_async(("crashed", 0.0), task_id=task_id, flow_queue="once")
    # The redelivered copy is denied (the gate holds the slot), meets its own row and is acked.
    # Acked: out of the broker on two looks 0.3 s apart (a message being delivered is briefly
    # in neither the queue nor the unacked table, so one look can see it gone too early).
    wait_for(lambda: not h.in_broker(task_id) and not time.sleep(0.3) and not h.in_broker(task_id), 10,
             what="the redelivered copy to be acked")
    assert h.parked("once") == 1
    assert "crashed" not in h.gauge.runs()
    h.gauge.open_gate()
    done = h.wait_done(["crashed"], timeout=20)
    time.sleep(1.0)  # a second copy, if any, would run now
    assert h.gauge.runs()["crashed"] == 1 and done["crashed"] == 1
    assert h.parked("once") == 0
