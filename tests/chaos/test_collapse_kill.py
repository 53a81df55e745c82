"""Calls that collapse through kill -9: the node running a unique call dies (its key frees
within instance_ttl plus a renewal pass, and the redelivered run is still the same call), and
every node dies inside a debounce window (the burst still runs, once, with its last arguments)."""

from __future__ import annotations

import time
from typing import Any

from celery_flowcontrol.collapse.wiring import claims_of
from tests.support.harness import wait_for

INSTANCE_TTL = 3.0  # a run's unique key is renewed every INSTANCE_TTL / 3


def test_kill9_of_the_node_running_a_unique_call(make_collapse: Any) -> None:
    # RabbitMQ gives an unacked message back as soon as its consumer's connection dies.
    h = make_collapse(broker="rabbitmq", conf={"flowcontrol_instance_ttl": INSTANCE_TTL})
    victim = h.start_worker(concurrency=2, name="victim", env={"FCT_HOLD_SECONDS": "60"})
    sync = h.app.tasks["proj.sync"]
    claims = claims_of(h.app)
    key = "proj.sync:[[5],{}]"
    first = sync.delay(5)
    wait_for(lambda: len(h.listed("runs")) == 1, 20, what="the run to start on the victim")
    assert claims.holder("unique", key) == first.id and sync.delay(5).id == first.id
    h.kill9(victim)
    killed = time.monotonic()
    wait_for(lambda: claims.holder("unique", key) is None, INSTANCE_TTL + 3,
             what="the dead node's unique key to lapse")
    freed = time.monotonic() - killed
    assert freed <= INSTANCE_TTL + INSTANCE_TTL / 3 + 0.5
    # The broker redelivers the run to a new node: the same call, holding its key again.
    h.start_worker(concurrency=2, name="survivor", env={"FCT_HOLD_SECONDS": "2"})
    wait_for(lambda: len(h.listed("runs")) == 2, 20, what="the redelivered run to start")
    runs = [r.split("|") for r in h.listed("runs")]
    assert [r[0] for r in runs] == [first.id, first.id] and runs[1][2] == "survivor"
    wait_for(lambda: claims.holder("unique", key) == first.id, 5, what="the run to hold its key")
    assert sync.delay(5).id == first.id
    assert first.get(timeout=20) == 5
    wait_for(lambda: claims.holder("unique", key) is None, 5, what="the key to free on landing")
    print(f"chaos collapse unique kill: key freed {freed:.2f} s after kill -9 "
          f"(instance_ttl {INSTANCE_TTL:g} s), redelivered run kept the first call's id")


def test_kill9_of_every_node_inside_a_debounce_window(make_collapse: Any) -> None:
    h = make_collapse(broker="redis")
    nodes = [h.start_worker(concurrency=2, name=n, wait=False) for n in ("w1", "w2")]
    for node in nodes:
        h.wait_ready(node)
    reindex = h.app.tasks["proj.reindex"]
    burst = [reindex.delay("doc", v) for v in range(5)]
    for node in nodes:
        h.kill9(node)  # inside the 1 s window: nothing has run, the row is all there is
    assert h.listed("reindexed") == [] and h.parked() == 1
    time.sleep(1.2)  # due while no worker lives
    h.start_worker(concurrency=2, name="w3")
    assert [r.get(timeout=20) for r in burst] == [4] * 5
    time.sleep(1.5)  # nothing else runs later
    runs = h.listed("reindexed")
    assert len(runs) == 1 and runs[0].split("|")[:2] == [burst[0].id, "4"]
    assert h.parked() == 0
    print("chaos collapse debounce kill: burst of 5 ran once after every node was killed")
