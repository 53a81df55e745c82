"""The tenant verbs of ``celery flowcontrol`` (``key``, ``keys``, ``pause``, ``resume``) and what
``list`` shows of bounds and pauses, through click's runner on an in-process backend the test
also holds: every figure printed is checked against the backend, every bad value exits 1 with
one line naming the queue, the key and the field."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import MemoryBackend, Ticket
from tests.unit.test_cli import Clock, one_line_error, run


@pytest.fixture
def world(sqlite_url: str) -> Any:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        flowcontrol_queues=[{"name": "reports", "concurrency": 2, "fairness": "key",
                             "per_key_concurrency": 1, "max_waiting": 100,
                             "keys": {"acme": {"weight": 3}}},
                            {"name": "mail", "concurrency": 1}],
        flowcontrol_backend=backend, flowcontrol_parking_url=sqlite_url)
    fc = FlowControl(app)
    for config in fc.settings.queues:
        backend.register(config)
    for i, key in enumerate(["acme", "acme", "acme", "bigco", "bigco"]):
        backend.try_admit(Ticket("reports", f"t{i}", "w1/1/ab", fairness_key=key))
    yield SimpleNamespace(app=app, fc=fc, backend=backend, clock=clock)
    fc.store.close()


def ok_json(world: Any, *args: str) -> Any:
    result = run(world, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_keys_lists_the_busiest_keys_as_the_backend_counts_them(world: Any) -> None:
    data = ok_json(world, "keys", "reports")
    rows = {r["key"]: r for r in data["keys"]}
    stats = {s.key: s for s in world.backend.key_stats("reports")}
    assert set(rows) == {"acme", "bigco"} == set(stats)
    for key, row in rows.items():
        assert (row["busy"], row["waiting"], row["weight"]) == \
            (stats[key].busy, stats[key].waiting, stats[key].weight)
    assert rows["acme"]["weight"] == 3 and rows["acme"]["overridden"] is True
    assert rows["bigco"]["overridden"] is False
    assert math.isclose(sum(r["share"] for r in rows.values()), 1.0)
    assert data["queue"]["max_waiting"] == 100
    human = run(world, "keys", "reports").stdout
    assert "reports: 2 busy, 3 waiting (at most 100), 0 refused" in human
    assert "acme*" in human and "SHARE 1m" in human


def test_key_sets_and_resets_one_key_fleet_wide(world: Any) -> None:
    result = run(world, "key", "reports", "bigco", "--weight", "2", "--concurrency", "2",
                 "--rate", "60/m", "--max-waiting", "10")
    assert result.exit_code == 0, result.output
    assert "reports: key bigco overridden: concurrency, max_waiting, rate_limit, weight" in result.stdout
    stats = {s.key: s for s in world.backend.key_stats("reports")}["bigco"]
    assert (stats.weight, stats.concurrency, stats.max_waiting, stats.overridden) == (2, 2, 10, True)
    assert [r.limit for r in stats.rate_limit or ()] == [60]
    data = ok_json(world, "key", "reports", "bigco", "reset")
    assert data["changed"] == "reset to config"
    stats = {s.key: s for s in world.backend.key_stats("reports")}["bigco"]
    assert (stats.weight, stats.concurrency, stats.overridden) == (1, 1, False)


@pytest.mark.parametrize(("args", "field"), [
    (["--weight", "0"], "keys['acme'].weight"),
    (["--reserve", "-1"], "keys['acme'].reserve"),
    (["--max-waiting", "0"], "keys['acme'].max_waiting"),
    (["--rate", "lots"], "keys['acme'].rate_limit"),
])
def test_key_refuses_a_bad_value_naming_queue_key_and_field(world: Any, args: list[str],
                                                            field: str) -> None:
    line = one_line_error(run(world, "key", "reports", "acme", *args))
    assert "flow queue 'reports'" in line and field in line, line
    assert {s.key: s for s in world.backend.key_stats("reports")}["acme"].weight == 3


def test_key_of_an_unknown_queue_names_it(world: Any) -> None:
    assert "'nope'" in one_line_error(run(world, "key", "nope", "acme", "--weight", "2"))
    assert "'nope'" in one_line_error(run(world, "keys", "nope"))
    assert "'nope'" in one_line_error(run(world, "pause", "nope"))


def test_pause_and_resume_a_key_and_the_queue(world: Any) -> None:
    result = run(world, "pause", "reports", "--key", "bigco", "--for", "10m")
    assert result.exit_code == 0 and "reports: key bigco paused until" in result.stdout, result.output
    rows = {r["key"]: r for r in ok_json(world, "keys", "reports")["keys"]}
    assert rows["bigco"]["paused_until"] == pytest.approx(world.clock.now + 600)
    assert rows["acme"]["paused"] == "-"
    assert "until" in run(world, "keys", "reports").stdout
    assert run(world, "resume", "reports", "--key", "bigco").stdout.strip() == "reports: key bigco resumed"
    assert {r["key"]: r for r in ok_json(world, "keys", "reports")["keys"]}["bigco"]["paused"] == "-"

    assert ok_json(world, "pause", "reports") == {"key": None, "paused_until": None, "queue": "reports"}
    assert world.backend.stats("reports").paused_until == math.inf
    listed = run(world, "list").stdout
    line = next(x for x in listed.splitlines() if x.startswith("reports"))
    assert "until resumed" in line and "3/100" in line
    assert {r["name"]: r for r in ok_json(world, "list")}["reports"]["paused"] is True
    assert "PAUSED until resumed" in run(world, "keys", "reports").stdout
    assert run(world, "resume", "reports").exit_code == 0
    assert world.backend.stats("reports").paused_until is None


def test_pause_for_a_bad_duration_names_the_field(world: Any) -> None:
    line = one_line_error(run(world, "pause", "reports", "--for", "soon"))
    assert "flow queue 'reports'" in line and "'until'" in line


def test_list_shows_refusals(world: Any) -> None:
    for i in range(200):
        world.backend.try_admit(Ticket("reports", f"flood-{i}", "w1/1/ab", fairness_key=f"f{i}"))
    refused = world.backend.stats("reports").refused
    assert refused == 200 - (100 - 3)
    rows = {r["name"]: r for r in ok_json(world, "list")}
    assert rows["reports"]["refused"] == refused and rows["mail"]["refused"] == 0
    line = next(x for x in run(world, "list").stdout.splitlines() if x.startswith("reports"))
    assert "100/100" in line and str(refused) in line.split()
