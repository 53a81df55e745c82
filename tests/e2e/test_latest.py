"""``flow_unique_keep="latest"`` on real prefork workers, on a Redis and a RabbitMQ broker,
with and without a flow queue: a newer call terminates the running one and replaces the
waiting one (both end REVOKED naming their successor), the newest call runs, and no two
runs of a key overlap (each run beats every 0.05 s while it runs)."""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import TaskRevokedError

from celery_flowcontrol.collapse.wiring import latest_of
from tests.support.harness import wait_for

CONF = {"flowcontrol_queues": [{"name": "api", "concurrency": 2}]}


def runs_of(h: Any) -> dict[str, dict[str, float]]:
    """Each run's id -> {"start": at, "end": at (if it ended), "last": its last beat}."""
    runs: dict[str, dict[str, float]] = {}
    for line in h.listed("recomputed"):
        tid, _, _, what, at = line.split("|")
        runs.setdefault(tid, {})[what] = float(at)
    for line in h.listed("beats"):  # read after: a run that started in between has no start
        tid, at = line.split("|")
        if tid in runs:
            runs[tid]["last"] = max(runs[tid].get("last", 0.0), float(at))
    return runs


def assert_never_two_at_once(runs: dict[str, dict[str, float]]) -> None:
    """A terminated run ends at its last beat (within 0.05 s: the beats' step)."""
    spans = sorted((r["start"], r.get("end", r.get("last", r["start"]))) for r in runs.values())
    until = 0.0
    for start, end in spans:
        assert start >= until, f"a run started at {start:.3f} while another ran until {until:.3f}"
        until = max(until, end)


def replaced_by(result: Any) -> str:
    with pytest.raises(TaskRevokedError) as revoked:
        result.get(timeout=20)
    assert result.state == "REVOKED"
    return str(revoked.value.args[1]["replaced_by"])


@pytest.mark.parametrize(("broker", "task"), [("redis", "proj.recompute"),
                                              ("rabbitmq", "proj.recompute_gated")])
def test_the_latest_call_wins_on_real_workers(make_collapse: Any, broker: str, task: str) -> None:
    h = make_collapse(broker=broker, conf=CONF)
    h.start_worker(concurrency=3)
    recompute = h.app.tasks[task]
    first = recompute.delay("board", 1, 30)
    wait_for(lambda: first.id in runs_of(h), 20, what="the first run to start")
    second = recompute.delay("board", 2, 30)
    third = recompute.delay("board", 3, 0.3)  # before the second ran: it replaces it waiting
    assert third.get(timeout=30) == 3
    assert replaced_by(first) == second.id and replaced_by(second) == third.id
    runs = runs_of(h)
    # Replaced while it waited for the first run's end (never ran), or, on a loaded box,
    # terminated in turn just after it started: it never ran to its end.
    assert "end" not in runs.get(second.id, {})
    assert "end" not in runs[first.id]  # terminated mid-run (prefork)
    assert_never_two_at_once(runs)
    # The newest run ended: a later call replaces nothing and runs at once.
    wait_for(lambda: latest_of(h.app).held()[0].done, 5, what="the key's run to end")
    assert recompute.delay("board", 4, 0.1).get(timeout=20) == 4
    assert third.get(timeout=1) == 3
    assert_never_two_at_once(runs_of(h))
    print(f"e2e latest {broker} {task}: {len(runs_of(h))} runs, none overlapping; replaced "
          "calls REVOKED naming their successors")
