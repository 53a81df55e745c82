"""A message the parking database refuses for a reason other than an outage goes to the
dead-letter table with the reason, is acked (no loop), and shows in
``celery -A proj flowcontrol dead``; the worker goes on serving everyone else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import REPO, Harness, wait_for


def flowcontrol_cli(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A proj flowcontrol <args>`` in the harness's project directory."""
    env = {**os.environ, **h.env, "PYTHONPATH": os.pathsep.join([str(h.workdir), str(REPO)])}
    return subprocess.run(  # noqa: S603 - our interpreter, our arguments
        [sys.executable, "-m", "tests.support.celery_command", "-A", "proj", "flowcontrol", *args],
        cwd=h.workdir, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.timeout(90)
@pytest.mark.gated()
def test_an_unparkable_message_is_dead_lettered_once_and_listed(make_harness: MakeHarness) -> None:
    """Cap 1, held by a gate task. A task whose id holds a NUL (no SQL text column can store
    it) is denied, refused by the parking table, dead-lettered and acked; a normal task
    behind it parks and runs once the gate opens. The dead one never runs and is written
    once (no redelivery loop)."""
    h = make_harness(conf={"flowcontrol_queues": [{"name": "dl", "concurrency": 1, "retry": 1}]})
    h.start_worker(2)
    h.send("gate", "g0", flow_queue="dl")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the gate task to hold the slot")
    bad_id = "dead\x00letter"
    h.app.tasks["proj.work"].apply_async(("unparkable", 0.0), task_id=bad_id, flow_queue="dl")
    h.send("work", "normal", 0.0, flow_queue="dl")
    wait_for(lambda: len(h.store().dead_letters()) >= 1 and h.parked("dl") == 1, 20,
             what="one dead letter and one parked task")
    wait_for(lambda: not h.in_broker("unparkable"), 10, what="the dead-lettered message to be acked")
    h.gauge.open_gate()
    h.wait_done(["g0", "normal"], timeout=30)
    time.sleep(3.0)  # a loop would redeliver and dead-letter it again by now
    dead = h.store().dead_letters()
    runs = h.gauge.runs()
    out = flowcontrol_cli(h, "dead", "--json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    text = flowcontrol_cli(h, "dead")
    print(f"chaos dead-letters: dead={len(dead)} reason={dead[0].reason!r} "
          f"error={dead[0].error[:80]!r} runs={runs} cli_rows={len(listed)}")
    assert len(dead) == 1, [d.error for d in dead]
    assert dead[0].reason == "park-rejected" and "task_id" in dead[0].error
    assert "unparkable" not in runs and runs.get("normal") == 1
    assert [r["reason"] for r in listed] == ["park-rejected"] and listed[0]["queue"] == "dl"
    assert text.returncode == 0 and "park-rejected" in text.stdout and "\\x00" in text.stdout
    assert h.parked("dl") == 0
