"""The ``celery flowcontrol`` verbs through click's runner, on an in-process backend.

The app gets a ready :class:`MemoryBackend` (``flowcontrol_backend``) that the test also holds,
so every figure the command prints can be checked against the backend itself. Each error path
exits non-zero with exactly one line on stderr.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner, Result

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.cli import flowcontrol
from celery_flowcontrol.cli.render import table
from celery_flowcontrol.parking import ParkedMessage
from celery_flowcontrol.views.text import duration


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world(sqlite_url: str) -> Any:
    backend = MemoryBackend(clock=Clock())
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(
        flowcontrol_queues=[{"name": "api", "concurrency": 2, "rate_limit": "20/2s"},
                            {"name": "mail", "concurrency": 1, "max_hold": "1h"}],
        flowcontrol_backend=backend, flowcontrol_parking_url=sqlite_url)
    fc = FlowControl(app)
    for config in fc.settings.queues:
        backend.register(config)
    for i in range(4):
        backend.try_admit(Ticket("api", f"task-{i}", "w1/1/ab", priority=i % 2, fairness_key=f"k{i}",
                                 label=f"label-{i}"))
    yield SimpleNamespace(app=app, fc=fc, backend=backend)
    fc.store.close()


def runner() -> CliRunner:
    """A runner that keeps stderr apart from stdout: click 8.2 always does, and dropped the
    flag that asks click 8.1 to."""
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        return CliRunner()


def run(world: Any, *args: str) -> Result:
    return runner().invoke(flowcontrol, list(args), obj=SimpleNamespace(app=world.app))


def ok_json(world: Any, *args: str) -> Any:
    result = run(world, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def one_line_error(result: Result, code: int = 1) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    return lines[0]


# -- list ------------------------------------------------------------------------------------------


def test_list_shows_every_queue_with_its_figures(world: Any) -> None:
    result = run(world, "list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["QUEUE", "BUSY/CAP", "GRANTED", "WAITING", "PARKED", "RATE", "USED",
                                "MAX", "HOLD", "OVERRIDES"]
    api = next(line for line in lines if line.startswith("api"))
    assert api.split()[:5] == ["api", "2/2", "0", "2", "0"]
    assert "2 of 20/2s" in api
    mail = next(line for line in lines if line.startswith("mail"))
    assert "1h00m" in mail


def test_list_json_matches_the_backend_and_marks_overrides(world: Any) -> None:
    world.backend.set_capacity("api", 3)
    rows = {r["name"]: r for r in ok_json(world, "list")}
    stats = world.backend.stats("api")
    assert rows["api"]["in_use"] == stats.in_use == 2
    assert rows["api"]["granted"] == stats.granted == 1  # raising capacity granted the head waiter
    assert rows["api"]["waiting"] == stats.waiting == 1
    assert rows["api"]["capacity"] == 3 and rows["api"]["concurrency"] == 2
    assert rows["api"]["overrides"] == ["capacity"]
    assert rows["mail"]["max_hold"] == 3600.0 and rows["mail"]["overrides"] == []
    human = run(world, "list").stdout
    assert "3*" in human and "operator override" in human


def test_list_of_an_empty_backend_says_so(sqlite_url: str) -> None:
    app = Celery("empty", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_backend=MemoryBackend(), flowcontrol_parking_url=sqlite_url)
    result = runner().invoke(flowcontrol, ["list"], obj=SimpleNamespace(app=app))
    assert result.exit_code == 0 and "no flow queues: flowcontrol_queues configures none" in result.stdout
    result = runner().invoke(flowcontrol, ["list", "--json"], obj=SimpleNamespace(app=app))
    assert json.loads(result.stdout) == []


@pytest.fixture
def unbooted(sqlite_url: str) -> Any:
    """An app whose queues are configured, on a backend no worker has registered them in."""
    backend = MemoryBackend(clock=Clock())
    app = Celery("fresh", broker="memory://", set_as_current=False)
    app.conf.update(
        flowcontrol_queues=[{"name": "emails", "concurrency": 10, "rate_limit": "100/m"},
                            {"name": "reports", "concurrency": 4}],
        flowcontrol_backend=backend, flowcontrol_parking_url=sqlite_url)
    fc = FlowControl(app)
    yield SimpleNamespace(app=app, fc=fc, backend=backend)
    fc.store.close()


def test_list_before_any_worker_booted_shows_the_configured_queues_marked(unbooted: Any) -> None:
    result = run(unbooted, "list")
    assert result.exit_code == 0, result.output
    emails = next(line for line in result.stdout.splitlines() if line.startswith("emails"))
    assert emails.split()[:3] == ["emails", "(configured)", "0/10"] and "0 of 100/60s" in emails
    assert "not yet registered in the backend" in result.stdout
    rows = {r["name"]: r for r in ok_json(unbooted, "list")}
    assert rows["reports"]["registered"] is False and rows["reports"]["capacity"] == 4
    # Once a worker registered one, it is listed from the backend, unmarked.
    unbooted.backend.register(unbooted.fc.settings.queues[0])
    rows = {r["name"]: r for r in ok_json(unbooted, "list")}
    assert rows["emails"]["registered"] is True and rows["reports"]["registered"] is False
    assert [r["name"] for r in ok_json(unbooted, "list", "--limit", "1", "--after", "emails")] == ["reports"]
    assert "no slots, no waiters" in run(unbooted, "slots", "reports").stdout


# -- slots -----------------------------------------------------------------------------------------


def test_slots_lists_busy_slots_then_waiters_in_serving_order(world: Any) -> None:
    data = ok_json(world, "slots", "api")
    assert [s["slot_id"] for s in data["slots"]] == [s.slot_id for s in world.backend.busy_slots("api")]
    assert {s["holder"] for s in data["slots"]} == {"w1/1/ab"}
    assert [w["task_id"] for w in data["waiters"]] == [w.task_id for w in world.backend.waiters("api")]
    # task-3 has priority 1, so it is served before task-2
    assert [w["task_id"] for w in data["waiters"]] == ["task-3", "task-2"]
    assert [w["position"] for w in data["waiters"]] == [1, 2]
    human = run(world, "slots", "api").stdout
    assert human.index("busy slots (2)") < human.index("waiters (2") < human.index("task-3") < human.index("task-2")
    assert "label-0" in human


def test_slots_limit_shows_how_many_are_left_out(world: Any) -> None:
    human = run(world, "slots", "api", "--limit", "1").stdout
    assert "waiters (first 1 of 2" in human
    assert len(ok_json(world, "slots", "api", "--limit", "1")["waiters"]) == 1


def test_slots_shows_expiry_from_max_hold(world: Any) -> None:
    world.backend.try_admit(Ticket("mail", "m-1", "w1/1/ab"))
    slot = ok_json(world, "slots", "mail")["slots"][0]
    assert slot["expires_in"] == pytest.approx(3600.0)
    assert "1h00m" in run(world, "slots", "mail").stdout


# -- release ---------------------------------------------------------------------------------------


def test_release_needs_yes(world: Any) -> None:
    line = one_line_error(run(world, "release", "api:1"), code=2)
    assert "without --yes" in line
    assert world.backend.stats("api").in_use == 2


def test_release_frees_the_slot_and_grants_the_next_waiter(world: Any) -> None:
    result = run(world, "release", "api:1", "--yes")
    assert result.exit_code == 0 and result.stdout.strip() == "released slot api:1 of api"
    assert "api:1" not in [s.slot_id for s in world.backend.busy_slots("api")]
    assert [g.task_id for g in world.backend.pending_grants("api")] == ["task-3"]
    assert ok_json(world, "release", "api:2", "--yes") == {"queue": "api", "released": "api:2"}


@pytest.mark.parametrize(("slot", "says"), [
    ("api:99", "slot 'api:99' is not busy"),
    ("junk", "is not a slot id"),
    ("nope:1", "flow queue 'nope': is not registered"),
])
def test_release_of_what_is_not_busy_fails_with_one_line(world: Any, slot: str, says: str) -> None:
    assert says in one_line_error(run(world, "release", slot, "--yes"))


def test_releasing_twice_fails_the_second_time(world: Any) -> None:
    assert run(world, "release", "api:1", "--yes").exit_code == 0
    assert "is not busy" in one_line_error(run(world, "release", "api:1", "--yes"))


# -- capacity and max-hold ------------------------------------------------------------------------


def test_capacity_override_and_reset(world: Any) -> None:
    row = ok_json(world, "capacity", "api", "5")
    assert row["capacity"] == 5 and row["capacity_override"] == 5
    assert world.backend.stats("api").capacity == 5
    assert "capacity 2 (reset to config)" in run(world, "capacity", "api", "reset").stdout
    assert world.backend.stats("api").capacity_override is None


def test_capacity_zero_pauses_the_queue(world: Any) -> None:
    assert ok_json(world, "capacity", "api", "0")["capacity"] == 0


@pytest.mark.parametrize(("args", "says"), [
    (("capacity", "api", "many"), "field 'capacity'"),
    (("capacity", "api", "--", "-1"), "field 'capacity'"),
    (("capacity", "api", "100001"), "field 'capacity'"),
    (("capacity", "nope", "3"), "flow queue 'nope': is not registered"),
    (("max-hold", "api", "soon"), "field 'max_hold'"),
    (("max-hold", "api", "0"), "field 'max_hold'"),
    (("max-hold", "nope", "5m"), "flow queue 'nope': is not registered"),
    (("slots", "nope"), "flow queue 'nope': is not registered"),
    (("parked", "nope"), "flow queue 'nope': is not registered"),
])
def test_bad_values_and_unknown_queues_fail_with_one_line(world: Any, args: tuple[str, ...], says: str) -> None:
    assert says in one_line_error(run(world, *args))


def test_max_hold_override_applies_to_later_slots_and_resets(world: Any) -> None:
    row = ok_json(world, "max-hold", "api", "45m")
    assert row["max_hold"] == 2700.0 and row["overrides"] == ["max_hold"]
    assert "45m00s (overridden)" in run(world, "max-hold", "api", "45m").stdout
    assert ok_json(world, "max-hold", "api", "reset")["max_hold_override"] is None


# -- parked, migrate, workers ---------------------------------------------------------------------


def test_parked_lists_messages_in_wake_order(world: Any) -> None:
    for i, wake in enumerate((30.0, 10.0, 20.0)):
        world.fc.store.park(ParkedMessage(task_id=f"p-{i}", queue="api", body=b"{}", wake_at=1e9 + wake,
                                          task_name="proj.work", reason="concurrency"))
    assert [r["task_id"] for r in ok_json(world, "parked", "api")] == ["p-1", "p-2", "p-0"]
    human = run(world, "parked", "api", "--limit", "2").stdout
    assert "api: 3 parked, first 2 shown" in human and "proj.work" in human and "p-0" not in human
    assert ok_json(world, "list")[0]["parked"] == 3


def test_rate_without_a_limit_shows_the_limits_and_changes_nothing(world: Any, unbooted: Any) -> None:
    result = run(world, "rate", "api")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "api: rate limits 2 of 20/2s (from config)"
    assert run(world, "rate", "mail").stdout.strip() == "mail: rate limits none (from config)"
    assert world.backend.stats("api").rate_override is None
    run(world, "rate", "api", "5/s")
    assert "(operator override)" in run(world, "rate", "api").stdout
    assert ok_json(world, "rate", "api")["rate_override"] is True
    assert "0 of 100/60s (from config; not yet registered" in run(unbooted, "rate", "emails").stdout
    assert "is not registered" in one_line_error(run(world, "rate", "nope"))


def test_dashboard_without_its_extra_says_so_before_printing_an_address(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "flask", None)  # `import flask` raises ImportError
    monkeypatch.setattr("celery_flowcontrol.dashboard.serve", lambda fc, **kw: pytest.fail("served"))
    result = run(world, "dashboard")
    line = one_line_error(result)
    assert "pip install 'celery-flowcontrol[dashboard]'" in line
    assert "http://" not in result.stdout + result.stderr


@pytest.fixture
def no_app() -> Any:
    """``celery`` without ``-A`` takes the current app, which in a shell is Celery's default one.
    In this test process it is whatever app an earlier test made current (its queues, its
    parking URL): make a blank default app current for the test, as a shell would have it."""
    from celery import current_app

    previous = current_app._get_current_object()
    Celery("default", set_as_current=True)
    yield
    previous.set_current()


@pytest.mark.usefixtures("no_app")
def test_migrate_without_an_app_or_url_refuses_to_create_a_file_here(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.bin.celery import celery

    monkeypatch.chdir(tmp_path)
    result = runner().invoke(celery, ["flowcontrol", "migrate"])
    assert one_line_error(result, code=2).startswith("Error: no app and no parking URL")
    assert "celery -A proj flowcontrol migrate" in result.stderr
    assert list(tmp_path.iterdir()) == []
    result = runner().invoke(celery, ["flowcontrol", "migrate", "--url", "sqlite:///named.sqlite3"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "named.sqlite3").exists()


@pytest.mark.usefixtures("no_app")
@pytest.mark.parametrize("verb", [["list"], ["parked", "emails"], ["slots", "emails"], ["rate", "emails"]])
def test_a_verb_without_an_app_refuses_rather_than_read_or_make_a_file_here(
        verb: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from celery.bin.celery import celery

    monkeypatch.chdir(tmp_path)
    result = runner().invoke(celery, ["flowcontrol", *verb])
    line = one_line_error(result, code=2)
    assert line == (f"Error: no app: name yours with -A, as in `celery -A proj flowcontrol {verb[0]}` "
                    "(proj: the module of your Celery app)")
    assert list(tmp_path.iterdir()) == []


def test_migrate_creates_the_tables(world: Any, tmp_path: Any) -> None:
    target = f"sqlite:///{tmp_path / 'other.sqlite3'}"
    result = run(world, "migrate", "--url", target)
    assert result.exit_code == 0 and "are up to date" in result.stdout
    assert (tmp_path / "other.sqlite3").exists()


def test_migrate_of_an_unreachable_database_fails_with_one_line(world: Any) -> None:
    line = one_line_error(run(world, "migrate", "--url", "postgresql+psycopg://nobody@127.0.0.1:1/x"))
    assert "can't migrate the parking database" in line


def test_workers_without_any_worker_fails_with_one_line(world: Any) -> None:
    assert "no worker answered" in one_line_error(run(world, "workers", "--timeout", "0.2"))


def test_workers_shows_each_workers_figures(world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    replies = [{"w1@h": {"autoscaler": {"limit": 6, "inflight": 3, "rss_bytes": 50 * 2**20, "cpu_pct": 12.5,
                                        "throughput": 4.2, "p95_ms": 180.0,
                                        "last_adjustment": {"limit": 6, "previous": 5, "reason": "grow"}},
                         "admission": {"held": {"b": 1, "api": 2}, "parked": 7}}},
               {"w2@h": {"autoscaler": None}}]
    monkeypatch.setattr(world.app.control, "broadcast", lambda *a, **k: replies)
    data = ok_json(world, "workers")
    assert data["w1@h"]["autoscaler"]["limit"] == 6 and "w2@h" in data
    line = next(x for x in run(world, "workers").stdout.splitlines() if x.startswith("w1@h"))
    assert line.split()[:7] == ["w1@h", "6", "3", "50.0", "12.5", "4.2", "180.0"]
    assert "5->6 grow" in line
    assert line.split()[-3:] == ["api:2", "b:1", "7"]  # slots held by queue, parked in all


def test_dashboard_verb_serves_with_the_token(world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    monkeypatch.setattr("celery_flowcontrol.dashboard.serve", lambda fc, **kw: seen.update(kw, fc=fc))
    result = run(world, "dashboard", "--port", "0", "--token", "t0k")
    assert result.exit_code == 0, result.output
    assert seen == {"host": "127.0.0.1", "port": 0, "token": "t0k", "fc": world.fc}
    assert "changes need the token" in result.stderr


# -- rendering -------------------------------------------------------------------------------------


def test_durations_read_like_a_clock() -> None:
    assert [duration(s) for s in (None, 3.21, 65, 3725, 90000)] == ["-", "3.2s", "1m05s", "1h02m", "1d1h"]


def test_a_label_with_control_characters_stays_on_one_row() -> None:
    out = table(["A", "B"], [["x\ny\x1b[31m", 1]])
    assert out.count("\n") == 2 and "x\\ny\\x1b[31m" in out


# -- dead letters ----------------------------------------------------------------------------------


def dead_letter(world: Any, task_id: str, queue: str = "api", task_name: str = "proj.t") -> int:
    """A dead letter as the waker leaves one (wake-failed); its id."""
    m = ParkedMessage(task_id=task_id, queue=queue, body=b"[[], {}, {}]", wake_at=1.0,
                      task_name=task_name, headers={"id": task_id, "task": task_name},
                      routing_key="celery")
    world.fc.store.dead_letter(m, "wake-failed", "ChannelError: exchange gone")
    return next(d.id for d in world.fc.store.dead_letters(50) if d.task_id == task_id)


def test_dead_lists_the_letters_and_requeue_parks_them_due_now(world: Any) -> None:
    first, second = dead_letter(world, "d-1"), dead_letter(world, "d-2", "mail")
    assert [r["id"] for r in ok_json(world, "dead")] == [second, first]
    assert [r["task_id"] for r in ok_json(world, "dead", "--queue", "mail")] == ["d-2"]
    result = run(world, "dead", "requeue", str(first))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (f"requeued dead letter {first} (task d-1, proj.t, queue api): "
                                     "parked, due now")
    row = world.fc.store.get("d-1")
    assert row is not None and row.reason == "requeued" and row.wake_at <= time.time()
    assert (row.queue, row.routing_key, row.headers["id"]) == ("api", "celery", "d-1")
    assert [d.task_id for d in world.fc.store.dead_letters(50)] == ["d-2"]


def test_requeue_of_an_unknown_id_names_it_and_requeues_nothing(world: Any) -> None:
    known = dead_letter(world, "d-1")
    line = one_line_error(run(world, "dead", "requeue", str(known), "999", "998"))
    assert "no dead letter with id 998, 999" in line
    assert world.fc.store.get("d-1") is None and len(world.fc.store.dead_letters(50)) == 1


def test_a_bulk_requeue_needs_yes(world: Any) -> None:
    for i in range(3):
        dead_letter(world, f"d-{i}", "api" if i else "mail")
    line = one_line_error(run(world, "dead", "requeue", "--all"), code=2)
    assert line == "Error: refusing to requeue 3 dead letters in the table without --yes"
    line = one_line_error(run(world, "dead", "requeue", "--queue", "api"), code=2)
    assert line == "Error: refusing to requeue 2 dead letters of queue 'api' without --yes"
    assert world.fc.store.count() == 0
    done = ok_json(world, "dead", "requeue", "--queue", "api", "--yes")
    assert sorted(r["task_id"] for r in done) == ["d-1", "d-2"] and all(r["requeued"] for r in done)
    assert [d.task_id for d in world.fc.store.dead_letters(50)] == ["d-0"]
    assert run(world, "dead", "requeue", "--all", "--yes").exit_code == 0
    assert world.fc.store.count() == 3 and world.fc.store.dead_letters(50) == []


def test_a_letter_that_cant_be_parked_stays_with_the_reason(world: Any) -> None:
    parked = dead_letter(world, "d-1")
    world.fc.store.park(ParkedMessage(task_id="d-1", queue="api", body=b"{}", wake_at=1e9))
    too_long = dead_letter(world, "d-2", task_name="x" * 300)
    result = run(world, "dead", "requeue", str(parked), str(too_long))
    assert result.exit_code == 1
    assert result.stdout.splitlines() == [
        f"not requeued: dead letter {parked} (task d-1, proj.t, queue api): task d-1 is parked already",
        f"not requeued: dead letter {too_long} (task d-2, {'x' * 300}, queue api): can't be parked: "
        "field 'task_name': must be at most 255 characters, got 300"]
    assert len(world.fc.store.dead_letters(50)) == 2


@pytest.mark.parametrize("args", [[], ["1", "--all"], ["--queue", "api", "--all"]])
def test_requeue_takes_exactly_one_of_ids_queue_or_all(world: Any, args: list[str]) -> None:
    result = run(world, "dead", "requeue", *args)
    assert result.exit_code == 2 and "exactly one of them" in result.stderr
