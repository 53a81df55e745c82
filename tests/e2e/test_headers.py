"""Bad flow header values get their documented behaviour, and the message is never lost:
``flow_priority`` that is not an int is treated as 0 (one warning per task name); a fairness key
over 256 bytes is replaced by ``sha256:<hex>`` of it; an unknown flow queue runs ungated."""

from __future__ import annotations

import hashlib

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import wait_for


@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_bad_header_values_are_parked_as_documented_and_run(make_harness: MakeHarness) -> None:
    """Cap 1 held by a gate: each bad message is parked with the documented value, then runs."""
    h = make_harness(conf={"flowcontrol_queues": [{"name": "hdr", "concurrency": 1, "retry": "30s"}]})
    h.start_worker(2)
    h.send("gate", "gate0", flow_queue="hdr")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the gate task to start")
    big_key = "k" * 10_240
    high = [
        h.app.send_task("proj.work", ("high0", 0.0), headers={"flow_queue": "hdr", "flow_priority": "high"}).id,
        h.app.send_task("proj.work", ("high1", 0.0), headers={"flow_queue": "hdr", "flow_priority": "high"}).id,
    ]
    big = h.app.send_task("proj.work", ("big", 0.0), headers={"flow_queue": "hdr", "flow_fairness_key": big_key}).id
    wait_for(lambda: h.parked("hdr") == 3, 20, what="3 bad-header messages to be parked")
    store = h.store()
    assert [store.get(task_id).priority for task_id in high] == [0, 0]
    assert store.get(big).fairness_key == "sha256:" + hashlib.sha256(big_key.encode()).hexdigest()
    h.gauge.open_gate()
    done = h.wait_done(["high0", "high1", "big"], timeout=30)
    assert done == {"gate0": 1, "high0": 1, "high1": 1, "big": 1}
    warnings = [line for line in h.log_text().splitlines() if "WARNING" in line and "flow_priority" in line]
    assert len(warnings) == 1, f"expected one warning for task proj.work, got {warnings}"


@pytest.mark.timeout(60)
@pytest.mark.gated("hdr")
def test_bad_values_on_the_fast_path_and_unknown_queues_still_run(make_harness: MakeHarness) -> None:
    """With free slots: a 10 KB key and a string priority are admitted and run; a flow queue
    that was never registered runs ungated, with one warning naming it."""
    h = make_harness(conf={"flowcontrol_queues": [{"name": "hdr", "concurrency": 2}]})
    h.start_worker(2)
    h.app.send_task("proj.work", ("big",), headers={"flow_queue": "hdr", "flow_fairness_key": "x" * 10_240})
    h.app.send_task("proj.work", ("high",), headers={"flow_queue": "hdr", "flow_priority": "high"})
    h.app.send_task("proj.work", ("prio-none",), headers={"flow_queue": "hdr", "flow_priority": None})
    for i in range(3):
        h.send("work", f"unknown{i}", flow_queue="nosuchqueue")
    labels = ["big", "high", "prio-none", "unknown0", "unknown1", "unknown2"]
    done = h.wait_done(labels, timeout=30)
    assert all(done[label] == 1 for label in labels)
    warnings = [line for line in h.log_text().splitlines() if "WARNING" in line and "nosuchqueue" in line]
    assert len(warnings) == 1, f"expected one warning naming the unknown queue, got {warnings}"
