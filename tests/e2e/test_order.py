"""Waiters are served in the documented order: priority first; under ``fairness="key"`` the least
recently served tenant; then arrival. Each test holds the only slots with "gate" tasks until every
waiter is parked, so the order comes from the admission backend, not from send timing."""

from __future__ import annotations

import random

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import Harness, wait_for


def fill_gate(h: Harness, queue: str, count: int) -> None:
    """Take every slot of ``queue`` with gate tasks and wait until they run."""
    for i in range(count):
        h.send("gate", f"gate{i}", flow_queue=queue, fairness_key="gate")
    wait_for(lambda: h.gauge.started() == count, 20, what=f"{count} gate tasks to start")


@pytest.mark.gated()
@pytest.mark.timeout(90)
def test_higher_flow_priority_runs_first(make_harness: MakeHarness) -> None:
    """Cap 1, 50 parked waiters with priorities 0-9 sent in random order (PostgreSQL parking):
    once the gate opens they run by priority, highest first, and in arrival order within one."""
    h = make_harness(parking="postgres", conf={"flowcontrol_queues": [{"name": "prio", "concurrency": 1}]})
    h.start_worker(4)
    fill_gate(h, "prio", 1)
    rng = random.Random(3)
    sent = []
    for i in range(50):
        priority = rng.randrange(10)
        label = f"p{i:02d}-{priority}"
        sent.append(label)
        h.send("work", label, 0.01, flow_queue="prio", flow_priority=priority)
    wait_for(lambda: h.parked("prio") == 50, 30, what="50 waiters to be parked")
    h.gauge.open_gate()
    h.wait_done(sent, timeout=60)
    order = [run.label for run in h.gauge.executions() if not run.label.startswith("gate")]
    expected = sorted(sent, key=lambda label: (-int(label.split("-")[1]), label))
    assert order == expected, f"ran in this order: {order}"


@pytest.mark.gated()
@pytest.mark.timeout(90)
def test_fairness_by_key_serves_small_tenants_early(make_harness: MakeHarness) -> None:
    """Cap 2, fairness="key": tenant a sends 100 tasks, then b and c 5 each. All 10 of b and c
    are among the first 20 admissions (round robin over keys, least recently served first)."""
    queue = {"name": "fair", "concurrency": 2, "fairness": "key"}
    h = make_harness(conf={"flowcontrol_queues": [queue]})
    h.start_worker(4)
    fill_gate(h, "fair", 2)
    tenants = {"a": 100, "b": 5, "c": 5}
    labels = []
    for tenant, count in tenants.items():
        for i in range(count):
            label = f"{tenant}{i}"
            labels.append(label)
            h.send("work", label, 0.01, flow_queue="fair", fairness_key=f"tenant-{tenant}")
    wait_for(lambda: h.parked("fair") == 110, 30, what="110 waiters to be parked")
    h.gauge.open_gate()
    h.wait_done(labels, timeout=60)
    order = [run.label for run in h.gauge.executions() if not run.label.startswith("gate")]
    small = [i for i, label in enumerate(order) if label[0] in "bc"]
    assert len(small) == 10
    assert max(small) < 20, f"small tenants admitted at positions {small}; first 25: {order[:25]}"
