"""A dead letter comes back: requeued with ``celery -A proj flowcontrol dead requeue``, it runs
on a real prefork worker and completes (real Redis backend and broker; SQLite and PostgreSQL).

The story an operator lives: a task sent with a cost above the queue's ``per="cost"`` limit is
dead-lettered by the worker (``cost-refused``: no admission could ever take it); the operator
raises the limit (``flowcontrol rate``), then requeues the letter; the next poll publishes it,
admission takes it, and it runs once. The commands run as subprocesses in the project's
directory, with its environment, as an operator's shell would run them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import REPO, Harness, wait_for

COST_LIMIT = {"limit": 10, "period": "1m", "per": "cost"}


@pytest.fixture(params=["sqlite", "postgres"])
def harness(request: pytest.FixtureRequest, tmp_path: Path, redis_url: str,
            key_prefix: str) -> Iterator[Harness]:
    if request.param == "postgres":
        from celery_flowcontrol.parking import migrate

        parking_url = request.getfixturevalue("postgres_url")
        migrate(parking_url)
    else:
        parking_url = f"sqlite:///{tmp_path / 'park.sqlite3'}"
    h = Harness(workdir=tmp_path / "proj", broker_url=redis_url, gauge_url=redis_url, prefix=key_prefix,
                conf={"flowcontrol_backend_url": redis_url, "flowcontrol_parking_url": parking_url,
                      "flowcontrol_poll_interval": 0.2,
                      "flowcontrol_queues": [{"name": "api", "concurrency": 2,
                                              "rate_limit": COST_LIMIT}]})
    try:
        yield h
    except BaseException:
        print(h.logs())
        raise
    finally:
        h.close()


def celery(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A proj flowcontrol <args>`` in the project's directory."""
    env = {**os.environ, **h.env, "PYTHONPATH": os.pathsep.join([str(h.workdir), str(REPO)])}
    return subprocess.run(  # noqa: S603 - our interpreter, our arguments
        [sys.executable, "-m", "tests.support.celery_command", "-A", "proj", "flowcontrol", *args],
        cwd=h.workdir, env=env, capture_output=True, text=True, timeout=60, check=False)


def ok(h: Harness, *args: str) -> Any:
    result = celery(h, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_dead_letter_requeued_runs_on_a_worker_and_completes(harness: Harness) -> None:
    h = harness
    h.start_worker(2)
    # By name, so the producer does not refuse the cost itself (as a foreign producer would).
    task_id = h.app.send_task("proj.work", ("big", 0.01),
                              headers={"flow_queue": "api", "flow_cost": 50}).id
    h.send("work", "small", 0.01, flow_queue="api")
    h.wait_done(["small"], timeout=30)
    wait_for(lambda: len(h.store().dead_letters()) == 1, 20, what="the costly task to be dead-lettered")
    [letter] = ok(h, "dead")
    assert (letter["task_id"], letter["queue"], letter["reason"]) == (task_id, "api", "cost-refused")
    assert "big" not in h.gauge.runs() and h.parked() == 0

    refused = celery(h, "dead", "requeue", str(letter["id"] + 1000))
    assert refused.returncode == 1
    assert refused.stderr.strip() == (f"Error: no dead letter with id {letter['id'] + 1000} (requeued "
                                      "already, or never there: `celery flowcontrol dead` lists them)")
    ok(h, "rate", "api", json.dumps({**COST_LIMIT, "limit": 100}))
    [requeued] = ok(h, "dead", "requeue", str(letter["id"]))
    assert requeued["requeued"] and requeued["task_id"] == task_id

    h.wait_done(["big"], timeout=30)
    assert h.gauge.runs()["big"] == 1
    assert ok(h, "dead") == [] and h.parked() == 0
