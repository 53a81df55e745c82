"""The whole node dies at each named crash point (celery_flowcontrol/worker/crashpoints.py).

One node is started with ``FLOWCONTROL_CRASH_AT=<point>``; tasks go through a capped flow
queue whose denials park (lingering off), so the node passes every point of the path: park,
grant, wake, release. On the first pass of the armed point the node SIGKILLs its own process
group; a new node is started (RabbitMQ gives the dead node's unacked messages back at once)
and every task must run, none lost, the cap held, and a task run twice only where Celery's own
``acks_late`` would run it twice: its first run was cut mid-body by the kill, or ended just
before it (its late ack lost with the node).
"""

from __future__ import annotations

import time

import pytest

from celery_flowcontrol.worker.crashpoints import ENV, POINTS
from tests.support.fixtures import MakeHarness
from tests.support.harness import wait_for
from tests.support.projects.chaos import PARKING, ChaosHarness, verdict, wait_all

CAP = 2
TASKS = 12
#: A run that ended this long before the node's death may have lost its late ack with it.
ACK_WINDOW = 1.0
#: Each node's claim lease on a parked row, per crash point (the store's default, 30 s, where
#: none is named). A node killed at ``wake.claimed`` leaves rows leased and no copy of them
#: anywhere: they are woken again once the lease runs out, the same path at 5 s as at 30 s
#: (5 s is still far longer than a claim takes to publish and delete its row). At
#: ``wake.published`` the copy must be decided while its row is still leased, on a node
#: started after the death: there the default stays.
CLAIM_LEASE = {"wake.claimed": "5"}
CONF = {"flowcontrol_queues": [{"name": "c", "concurrency": CAP, "retry": 0.5}],
        "flowcontrol_instance_ttl": 3.0, "flowcontrol_reclaim_interval": 1.0,
        "flowcontrol_grant_ttl": 3.0, **PARKING}


def twice_unlike_celery(h: ChaosHarness, labels: list[str], died_at: float) -> dict[str, str]:
    """The labels that ran more often than Celery's ``acks_late`` would have run them, with
    their runs: once, or twice if a run was cut by the death (or ended within
    :data:`ACK_WINDOW` before it)."""
    runs: dict[str, list[tuple[float, float | None]]] = {}
    for r in h.gauge.executions():
        runs.setdefault(r.label, []).append((r.start, r.end))
    bad = {}
    for label in labels:
        mine = runs.get(label, [])
        # A run that never ended died with the node (the only one that died), even one that
        # began as the node was killing itself.
        cut = [s for s, e in mine if e is None or (s < died_at and e > died_at - ACK_WINDOW)]
        if len(mine) > 1 + min(len(cut), 1):
            bad[label] = ", ".join(f"{s - died_at:+.2f}..{'cut' if e is None else f'{e - died_at:+.2f}'}"
                                   for s, e in mine)
    return bad


@pytest.mark.timeout(150)
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.gated()
def test_the_node_dies_at_a_crash_point(make_harness: MakeHarness, point: str) -> None:
    h = make_harness(ChaosHarness, broker="rabbitmq", conf=CONF)
    lease = {"FCT_CLAIM_LEASE": CLAIM_LEASE[point]} if point in CLAIM_LEASE else {}
    victim = h.start_worker(4, name="victim", env={ENV: point, "FCT_TRACE": "1", **lease})
    labels = h.submit("c", TASKS, 0.3)
    wait_for(lambda: not victim.alive(), 40, 0.02, what=f"the node to die at {point}")
    died_at = h.gauge.server_time()
    assert victim.proc.returncode == -9
    survivor = h.start_worker(4, name="restarted", env={"FCT_TRACE": "1", **lease})
    wait_all(h, labels, ["c"], timeout=90)
    wait_for(lambda: h.parked() == 0, 30, what="the parking table to empty")
    time.sleep(1.5)  # a row woken twice would run again about now
    out = verdict(f"crash at {point}", h, labels, CAP, cut=died_at)
    bad = twice_unlike_celery(h, labels, died_at)
    print(f"chaos crash at {point}: runs per task {sorted(h.gauge.runs().values())}", flush=True)
    assert not out["missing"] and out["peak"] <= CAP
    assert not bad, f"ran twice where Celery would not (start..end from the death): {bad}"
    assert survivor.alive()
