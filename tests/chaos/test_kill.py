"""``kill -9`` of a worker node: while it holds slots and others are parked behind them, and
while it holds a message whose slot was granted to it but not yet confirmed.

Real prefork nodes, Redis broker and admission backend, PostgreSQL parking (own schema)."""

from __future__ import annotations

import time

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import wait_for
from tests.support.projects.chaos import ChaosHarness, verdict, wait_all

INSTANCE_TTL = 3.0
GRANT_TTL = 5.0


@pytest.mark.timeout(120)
@pytest.mark.gated()
def test_kill9_of_a_node_holding_slots_with_parked_tasks(make_harness: MakeHarness) -> None:
    """Cap 3 held by three 60 s tasks on the victim, 24 tasks parked behind them by the
    survivor; kill -9 of the victim. Its slots come back after instance_ttl, every task
    completes (the three killed ones redelivered by the broker), the cap holds throughout."""
    conf = {"flowcontrol_queues": [{"name": "k", "concurrency": 3, "retry": 0.5}],
            "flowcontrol_instance_ttl": INSTANCE_TTL, "flowcontrol_reclaim_interval": 1.0,
            "flowcontrol_grant_ttl": GRANT_TTL}
    h = make_harness(ChaosHarness, parking="postgres", conf=conf)
    victim = h.start_worker(3, name="victim", env={"FCT_HOLD_SECONDS": "60", "FCT_TRACE": "1"})
    holds = [f"hold{i}" for i in range(3)]
    for label in holds:
        h.send("hold", label, flow_queue="k")
    wait_for(lambda: h.gauge.started() == 3, 20, what="three holds on the victim")
    h.start_worker(3, name="survivor", env={"FCT_TRACE": "1"})
    labels = h.submit("k", 24, 0.2)
    wait_for(lambda: h.parked("k") >= 10, 30, what="tasks parked behind the victim's slots")
    parked = h.parked("k")
    killed_at = time.time()
    h.kill9(victim)
    wait_all(h, [*labels, *holds], ["k"], timeout=75)
    first = min(r.start for r in h.gauge.executions() if r.label.startswith("t") and r.start > killed_at)
    out = verdict("kill9-holding-slots", h, [*labels, *holds], 3, cut=killed_at,
                  extra=f"{parked} parked at the kill, first parked task ran "
                        f"{first - killed_at:.1f} s after it")
    assert not out["missing"] and out["peak"] <= 3
    assert first - killed_at <= INSTANCE_TTL + 1.0 + 2.0


@pytest.mark.timeout(120)
@pytest.mark.gated()
def test_kill9_of_the_node_granted_a_slot_before_it_confirmed(make_harness: MakeHarness) -> None:
    """Cap 1. Five tasks are parked behind a gate task; when the gate opens, the freed slot is
    granted to the first waiter and its message republished; the node that receives it is
    stalled in the gate (before admission: the grant unconfirmed) and killed -9. The grant
    passes on after grant_ttl, the waiters behind it run, the killed message comes back from
    the broker and runs; the cap holds."""
    conf = {"flowcontrol_queues": [{"name": "g", "concurrency": 1, "retry": 5}],
            "flowcontrol_instance_ttl": INSTANCE_TTL, "flowcontrol_grant_ttl": 3.0,
            "flowcontrol_reclaim_interval": 1.0}
    h = make_harness(ChaosHarness, parking="postgres", conf=conf)
    armed = {"FCT_STALL_LABEL": "'first0'", "FCT_TRACE": "1"}
    nodes = {"a": h.start_worker(1, name="a", env={**armed, "FCT_NODE": "a"})}
    h.send("gate", "g0", flow_queue="g")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the gate task to hold the slot")
    nodes["b"] = h.start_worker(2, name="b", env={**armed, "FCT_NODE": "b"})
    labels = h.submit("g", 1, 0.1, tag="first") + h.submit("g", 4, 0.1, tag="w")
    wait_for(lambda: h.parked("g") == 5, 30, what="five waiters parked")
    h.gauge.client.set(f"{h.prefix}:armed", "1")
    h.gauge.open_gate()
    wait_for(lambda: h.gauge.client.get(f"{h.prefix}:stalled") is not None, 20,
             what="the granted message to reach a node's gate")
    victim = nodes[h.gauge.client.get(f"{h.prefix}:stalled").decode()]
    killed_at = time.time()
    h.kill9(victim)
    h.gauge.client.delete(f"{h.prefix}:armed")
    wait_all(h, ["g0", *labels], ["g"], timeout=75)
    after = sorted(r.start for r in h.gauge.executions() if r.label.startswith("w"))
    out = verdict("kill9-granted-unconfirmed", h, ["g0", *labels], 1, cut=killed_at,
                  extra=f"victim node {victim.name}, next waiter ran "
                        f"{after[0] - killed_at:.1f} s after the kill")
    assert not out["missing"] and out["peak"] <= 1
