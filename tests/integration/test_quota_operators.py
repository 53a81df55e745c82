"""Operators see and steer quotas: ``celery flowcontrol rate``, each
limit's use, the live adaptive figure and a backoff in force in ``list``, on the dashboard and
in the metrics; the dashboard's change endpoints act only on an explicit value.

An in-process backend the test holds (so every figure is checked against it), click's runner,
Flask's test client, prometheus_client's text format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_flowcontrol import FlowControl, RateLimit
from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.cli import flowcontrol
from celery_flowcontrol.testing import FakeClock
from tests.support.services import need_dashboard_module

TOKEN = "s3cret-token"
QUEUES = [{"name": "api", "concurrency": 2, "rate_limit": "20/2s"},
          {"name": "llm", "rate_limit": ["5/m", {"limit": 1000, "period": 60, "per": "cost"},
                                         {"limit": 40, "period": 60, "adaptive": True}]}]


@pytest.fixture
def world(sqlite_url: str) -> Iterator[Any]:
    clock = FakeClock()
    backend = MemoryBackend(clock=clock)
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_queues=QUEUES, flowcontrol_backend=backend,
                    flowcontrol_parking_url=sqlite_url, flowcontrol_dashboard_token=TOKEN)
    fc = FlowControl(app)
    for config in fc.settings.queues:
        backend.register(config)
    backend.try_admit(Ticket("llm", "t1", "w1", cost=300))
    backend.try_admit(Ticket("llm", "t2", "w1", cost=200))
    backend.backoff("llm", 30)  # halves the adaptive limit: live 20
    yield SimpleNamespace(app=app, fc=fc, backend=backend, clock=clock)
    fc.store.close()


def cli(world: Any, *args: str) -> Any:
    return CliRunner().invoke(flowcontrol, list(args), obj=SimpleNamespace(app=world.app))


def test_list_shows_each_limit_its_live_figure_and_the_backoff(world: Any) -> None:
    out = cli(world, "list").output
    [line] = [x for x in out.splitlines() if x.startswith("llm")]
    assert "2 of 5/60s, 500 of 1000/60s cost, 2 of 40/60s adaptive (live 20)" in line
    assert "backoff until" in line
    [row] = [r for r in json.loads(cli(world, "list", "--json").output) if r["name"] == "llm"]
    assert [(r["limit"], r["used"], r["live"]) for r in row["rates"]] == [
        ("5/60s", 2, None), ("1000/60s cost", 500, None), ("40/60s adaptive", 2, 20)]
    assert row["backoff_until"] == world.clock() + 30


def test_rate_overrides_fleet_wide_until_reset(world: Any) -> None:
    r = cli(world, "rate", "api", "500/m", "10000/d")
    assert r.exit_code == 0 and "0 of 500/60s, 0 of 10000/86400s (overridden)" in r.output
    assert world.backend.stats("api").rate_override == (RateLimit(500, 60.0), RateLimit(10_000, 86_400.0))
    assert "rate_limit" in json.loads(cli(world, "list", "--json").output)[0]["overrides"]
    r = cli(world, "rate", "api", '{"limit": 900, "period": "1m", "per": "cost"}', "--json")
    assert json.loads(r.output)["rates"][0]["limit"] == "900/60s cost"
    r = cli(world, "rate", "api", "reset")
    assert r.exit_code == 0 and "reset to config" in r.output
    assert world.backend.stats("api").rate_override is None


@pytest.mark.parametrize(("args", "says"), [
    (("rate", "api", "fast"), "flow queue 'api': field 'rate_limit'"),
    (("rate", "api", "{nope"), "is not valid JSON"),
    (("rate", "nope", "5/s"), "flow queue 'nope': is not registered"),
    (("rate", "nope", "fast"), "flow queue 'nope': is not registered"),
])
def test_bad_rate_values_fail_with_one_line(world: Any, args: tuple[str, ...], says: str) -> None:
    r = cli(world, *args)
    assert r.exit_code != 0 and says in r.output
    assert world.backend.stats("api").rate_override is None


def test_metrics_show_each_limit_the_live_figure_and_the_backoff(world: Any) -> None:
    need_dashboard_module("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    from celery_flowcontrol.metrics import FlowControlCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FlowControlCollector(world.fc))
    text = generate_latest(registry).decode()
    assert 'flowcontrol_rate_limit_used{limit="1000/60s cost",queue="llm"} 500.0' in text
    assert 'flowcontrol_rate_limit_live{limit="40/60s adaptive",queue="llm"} 20.0' in text
    [until] = re.findall(r'^flowcontrol_backoff_until\{queue="llm"\} (\S+)$', text, re.M)
    assert float(until) == world.clock() + 30
    assert 'flowcontrol_backoff_until{queue="api"}' not in text, "no backoff there"


# -- the dashboard ------------------------------------------------------------------------------

def dashboard(world: Any) -> Any:
    need_dashboard_module("flask")
    from celery_flowcontrol.dashboard import create_app

    return create_app(world.fc, sampler=False, worker_timeout=0.05).test_client()


BEARER = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}


def test_the_queue_page_shows_each_limit_and_edits_the_rate(world: Any) -> None:
    c = dashboard(world)
    page = c.get("/queues/llm").data.decode()
    assert "500 of 1000/60s cost" in page and "(live 20)" in page and "until " in page
    r = c.post("/queues/llm/rate", data={"value": "7/m, 2000/m"}, headers=BEARER)
    assert r.status_code == 200 and r.json["ok"] is True and "(overridden)" in r.json["message"]
    assert world.backend.stats("llm").rate_override == (RateLimit(7, 60.0), RateLimit(2000, 60.0))
    r = c.post("/queues/llm/rate", data={"value": "reset"}, headers=BEARER)
    assert r.status_code == 200 and world.backend.stats("llm").rate_override is None


@pytest.mark.parametrize("path", ["/queues/api/capacity", "/queues/api/max-hold",
                                  "/queues/api/rate"])
def test_a_misnamed_or_missing_field_is_a_400_naming_it_and_changes_nothing(
        world: Any, path: str) -> None:
    c = dashboard(world)
    world.backend.set_capacity("api", 5)
    world.backend.set_max_hold("api", 60)
    world.backend.set_rate_limit("api", "9/s")
    before = world.backend.stats("api")
    for data, says in (({"capacity": "5"}, "field 'capacity'"), ({}, "field 'value' is required"),
                       ({"value": ""}, "field 'value' is required"),
                       ({"value": ["3", "4"]}, "field 'value' was sent 2 times")):
        r = c.post(path, data=data, headers=BEARER)
        assert r.status_code == 400 and says in r.json["error"], (data, r.data)
    assert world.backend.stats("api") == before, "nothing was reset"


@pytest.mark.parametrize(("path", "value", "status", "says"), [
    ("/queues/api/capacity", "-1", 400, "field 'capacity'"),
    ("/queues/api/max-hold", "0", 400, "field 'max_hold'"),
    ("/queues/api/rate", "fast", 400, "field 'rate_limit'"),
    ("/queues/nope/rate", "5/s", 404, "flow queue 'nope': is not registered"),
])
def test_a_refused_value_answers_json_to_a_client_that_asked_for_it(
        world: Any, path: str, value: str, status: int, says: str) -> None:
    r = dashboard(world).post(path, data={"value": value}, headers=BEARER)
    assert r.status_code == status and r.is_json and says in r.json["error"]


def test_the_reset_button_resets_explicitly(world: Any) -> None:
    """The page's Reset button posts ``value=reset`` next to the (empty) text field."""
    c = dashboard(world)
    csrf = re.search(r'name="csrf" value="([^"]+)"', c.get("/queues/api").data.decode())[1]  # type: ignore[index]
    assert c.post("/unlock", data={"csrf": csrf, "token": TOKEN, "next": "/queues/api"}).status_code == 303
    page = c.get("/queues/api").data.decode()
    assert 'id="rate-form"' in page
    world.backend.set_rate_limit("api", "9/s")
    r = c.post("/queues/api/rate", data={"csrf": csrf, "value": ["", "reset"]})
    assert r.status_code == 303 and world.backend.stats("api").rate_override is None
