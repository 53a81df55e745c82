"""``celery flowcontrol list`` in pages: ``--limit`` queues by name, from ``--after`` on, and a
last line naming the next page while there is one (10,000 queues list in pages, not at once)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.cli import flowcontrol
from celery_flowcontrol.config import QueueConfig
from tests.unit.test_cli import runner

NAMES = [f"q{i:03d}" for i in range(25)]


@pytest.fixture
def app(sqlite_url: str) -> Any:
    backend = MemoryBackend()
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_backend=backend, flowcontrol_parking_url=sqlite_url)
    fc = FlowControl(app)
    for name in NAMES:
        backend.register(QueueConfig(name, concurrency=1))
    yield app
    fc.store.close()


def listed(app: Any, *args: str) -> tuple[list[str], list[str]]:
    result = runner().invoke(flowcontrol, ["list", *args], obj=SimpleNamespace(app=app))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    return [line.split()[0] for line in lines[1:] if line.startswith("q")], lines


def test_a_page_then_the_next_one_named_by_the_last_line(app: Any) -> None:
    first, lines = listed(app, "--limit", "10")
    assert first == NAMES[:10] and lines[-1] == "more queues: --after q009"
    second, _ = listed(app, "--limit", "10", "--after", "q009")
    third, lines = listed(app, "--limit", "10", "--after", "q019")
    assert second == NAMES[10:20] and third == NAMES[20:]
    assert not lines[-1].startswith("more queues")


def test_a_page_that_ends_exactly_at_the_last_queue_names_no_next_page(app: Any) -> None:
    names, lines = listed(app, "--limit", "5", "--after", "q019")
    assert names == NAMES[20:] and not lines[-1].startswith("more queues")


def test_limit_0_lists_all_and_after_need_not_be_a_queue(app: Any) -> None:
    assert listed(app, "--limit", "0")[0] == NAMES
    assert listed(app, "--after", "q0105")[0] == NAMES[11:]  # between q010 and q011


def test_json_is_paged_the_same_way(app: Any) -> None:
    result = runner().invoke(flowcontrol, ["list", "--json", "--limit", "3", "--after", "q001"],
                             obj=SimpleNamespace(app=app))
    assert [r["name"] for r in json.loads(result.stdout)] == ["q002", "q003", "q004"]
