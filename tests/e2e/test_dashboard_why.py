"""The dashboard's search box in a real headless Chromium: a task id typed into it is answered
as ``why`` answers (a parked task's place in line and what holds it; an id nobody sent is
unseen), on the test's Redis backend and SQLite parking."""

from __future__ import annotations

from typing import Any

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import Ticket
from celery_flowcontrol.parking import ParkedMessage
from tests.e2e.test_dashboard import browser, dashboard, expect, page, shot

__all__ = ["browser", "page"]  # the fixtures of test_dashboard.py, shared


def test_a_task_id_typed_into_the_search_box_says_why_it_waits(make_harness: Any,
                                                               page: Any) -> None:
    h = make_harness(conf={"flowcontrol_queues": [{"name": "reports", "concurrency": 1}]})
    fc = FlowControl(h.app)
    for config in fc.settings.queues:
        fc.backend.register(config)
    fc.backend.try_admit(Ticket("reports", "running-1", "w1/1/ab"))
    denied = fc.backend.try_admit(Ticket("reports", "waiting-1", "w1/1/ab"))
    fc.store.park(ParkedMessage(task_id="waiting-1", queue="reports", body=b"[]",
                                wake_at=denied.retry_at, reason="concurrency"))
    with dashboard(fc) as url:
        page.goto(url)
        page.fill("#why-search input", "waiting-1")
        page.press("#why-search input", "Enter")
        expect(page.locator("#why-text")).to_have_text(
            "task waiting-1 is parked in queue reports, 1st of 1: 1 of 1 slots busy")
        expect(page.locator("#why-where")).to_have_text("parked")
        expect(page.locator("#why-reason")).to_have_text("concurrency")
        shot(page, "why")
        page.fill("#why-search input", "never-sent")
        page.press("#why-search input", "Enter")
        expect(page.locator("#why-where")).to_have_text("unseen")
        assert page.request.get(f"{url}/api/why/waiting-1").json()["position"] == 1
