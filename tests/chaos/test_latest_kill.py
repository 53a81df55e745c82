"""Latest wins through kill -9: the node running a key's call dies before a newer call comes,
so nobody can terminate that run; the newer call runs on another node only once the dead
run's lease lapsed (within instance_ttl plus a renewal pass), and the dead call, redelivered
(it acks late), never runs again: it ends REVOKED naming the call that replaced it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery.exceptions import TaskRevokedError

from celery_flowcontrol.collapse.wiring import latest_of
from tests.support.harness import wait_for

INSTANCE_TTL = 6.0  # a run's lease is renewed every INSTANCE_TTL / 3: it outlives a node's start


def test_kill9_of_the_node_running_the_current_call(make_collapse: Any) -> None:
    # RabbitMQ gives an unacked message back as soon as its consumer's connection dies.
    h = make_collapse(broker="rabbitmq", conf={"flowcontrol_instance_ttl": INSTANCE_TTL})
    victim = h.start_worker(concurrency=2, name="victim")
    recompute = h.app.tasks["proj.recompute"]
    keys = latest_of(h.app)
    first = recompute.delay("board", 1, 60)
    wait_for(lambda: any(line.startswith(first.id) for line in h.listed("recomputed")), 20,
             what="the first run to start on the victim")
    h.kill9(victim)
    killed = time.time()
    second = recompute.delay("board", 2, 0.2)  # before any node can take the dead call again
    # A start takes seconds, and on a busy machine longer than the lease lives: the lease is
    # watched while the survivor boots.
    survivor = h.start_worker(concurrency=2, name="survivor", wait=False)
    # Until the dead run's lease lapses, the key shows it running, and the newer call waits.
    held_until = killed
    while not any(line.startswith(second.id) for line in h.listed("recomputed")):
        [held] = keys.held()
        if held.running == first.id:
            held_until = time.time()
        assert time.time() - killed < 30, "the newer call never ran"
        time.sleep(0.05)
    h.wait_ready(survivor)
    assert second.get(timeout=20) == 2
    runs = {}
    for line in h.listed("recomputed"):
        tid, _, node, what, at = line.split("|")
        runs[(tid, what)] = (node, float(at))
    started = runs[(second.id, "start")][1]
    assert held_until - killed > 0.5  # the newer call waited while the dead run's lease lived
    assert started >= held_until  # and it never ran while that lease was live
    assert started - killed <= INSTANCE_TTL + INSTANCE_TTL / 3 + 5  # the lease lapsed, not more
    assert runs[(second.id, "start")][0] == "survivor" and (first.id, "end") not in runs
    # The dead call came back (acks late) and found itself replaced: it never ran again.
    starts = [line for line in h.listed("recomputed") if line.startswith(first.id)]
    assert len(starts) == 1
    with pytest.raises(TaskRevokedError) as revoked:
        first.get(timeout=10)
    assert revoked.value.args[1]["replaced_by"] == second.id
    print(f"chaos latest kill: the newer call ran {started - killed:.2f} s after kill -9 "
          f"(instance_ttl {INSTANCE_TTL:g} s); the lease was live until "
          f"{held_until - killed:.2f} s; the dead call never ran again")
