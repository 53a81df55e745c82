"""The dashboard's Dead letters page in a real headless Chromium: a dead letter a real worker
left (a cost above the queue's ``per="cost"`` limit) is listed with its reason, queue, task name
and time; requeueing it needs the token; once the limit is raised, Requeue brings it back and
the worker runs it."""

from __future__ import annotations

import json
import re
from typing import Any

from celery_flowcontrol import FlowControl
from celery_flowcontrol.views.changes import set_rate_limit
from tests.e2e.test_dashboard import browser, dashboard, expect, page, shot
from tests.support.harness import wait_for

__all__ = ["browser", "page"]  # the fixtures of test_dashboard.py, shared

COST_LIMIT = {"limit": 10, "period": "1m", "per": "cost"}


def _forged_requeue(page: Any, letter: int) -> dict[str, Any]:
    """POST a requeue from the page's own origin, with whatever CSRF token the page holds."""
    return page.evaluate(
        """async (id) => {
            const csrf = document.querySelector('input[name="csrf"]');
            const body = new URLSearchParams({id: String(id), csrf: csrf ? csrf.value : ''});
            const r = await fetch('/dead/requeue', {method: 'POST', body});
            return {status: r.status, text: await r.text()};
        }""",
        letter,
    )


def test_a_dead_letter_is_listed_and_requeued_from_the_page_with_the_token(make_harness: Any,
                                                                          page: Any) -> None:
    h = make_harness(conf={"flowcontrol_queues": [{"name": "api", "concurrency": 2,
                                                   "rate_limit": COST_LIMIT}]})
    h.start_worker(2)
    # By name, so the producer does not refuse the cost itself (as a foreign producer would).
    task_id = h.app.send_task("proj.work", ("big", 0.01), headers={"flow_queue": "api", "flow_cost": 50}).id
    wait_for(lambda: len(h.store().dead_letters()) == 1, 30, what="the costly task to be dead-lettered")
    [letter] = h.store().dead_letters()
    fc = FlowControl(h.app)
    with dashboard(fc, token="s3cret") as url:
        page.goto(f"{url}/dead")
        row = page.locator(f'#dead tr[data-id="{letter.id}"]')
        expect(row).to_contain_text(task_id)
        expect(row).to_contain_text("proj.work")
        expect(row.locator("td").nth(3)).to_have_text("api")
        expect(row.locator("td").nth(4)).to_have_text("cost-refused")
        expect(row.locator("td").nth(5)).to_have_text(re.compile(r"^\d\d:\d\d:\d\d"))  # when()
        expect(page.locator("#dead button")).to_have_count(0)  # locked: no Requeue
        answer = _forged_requeue(page, letter.id)
        assert answer["status"] == 403 and "need the dashboard token" in answer["text"]
        shot(page, "dead-locked")

        page.fill('#mode input[name="token"]', "s3cret")
        page.click('#mode button:text("Unlock")')
        expect(page.locator("#mode")).to_contain_text("Changes are allowed")
        set_rate_limit(fc, "api", json.dumps({**COST_LIMIT, "limit": 100}))
        row.locator('button:text("Requeue")').click()
        expect(page.locator(".flash")).to_have_text(
            f"requeued dead letter {letter.id} (task {task_id}, proj.work, queue api): parked, due now")
        expect(page.locator("#no-dead")).to_have_text("No dead letters.")
        shot(page, "dead-requeued")
        h.wait_done(["big"], timeout=30)
        assert h.gauge.runs()["big"] == 1 and h.parked() == 0
        answer = _forged_requeue(page, letter.id)  # unlocked, but it is gone: said clearly
        assert answer["status"] == 400 and f"no dead letter with id {letter.id}" in answer["text"]
