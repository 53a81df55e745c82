"""A queue's tenants page in a real headless Chromium, on the test's Redis backend: the busiest
keys as ``flowcontrol keys`` shows them, a chart of admissions by key, and Pause / Resume (for a
key and for the queue) that need the dashboard token, as every change does."""

from __future__ import annotations

from typing import Any

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import Ticket
from tests.e2e.test_dashboard import browser, dashboard, expect, page, shot

__all__ = ["browser", "page"]  # the fixtures of test_dashboard.py, shared


def _forged(page: Any, path: str, key: str) -> dict[str, Any]:
    """POST a pause or resume from the page's own origin, with whatever CSRF token it holds."""
    return page.evaluate(
        """async ([path, key]) => {
            const csrf = document.querySelector('input[name="csrf"]');
            const body = new URLSearchParams({key, csrf: csrf ? csrf.value : ''});
            const r = await fetch(path, {method: 'POST', body});
            return {status: r.status, text: await r.text()};
        }""",
        [path, key],
    )


def test_tenants_page_shows_keys_and_pauses_them_with_the_token(make_harness: Any, page: Any) -> None:
    h = make_harness(conf={"flowcontrol_queues": [
        {"name": "reports", "concurrency": 4, "fairness": "key", "per_key_concurrency": 2,
         "keys": {"acme": {"weight": 3}}}]})
    fc = FlowControl(h.app)
    for config in fc.settings.queues:
        fc.backend.register(config)
    for i, key in enumerate(["acme", "acme", "acme", "bigco", "bigco", "<b>x</b>"]):
        fc.backend.try_admit(Ticket("reports", f"t{i}", "w1/1/ab", fairness_key=key))
    with dashboard(fc, token="s3cret") as url:
        page.goto(f"{url}/queues/reports")
        page.click("#tenants-link")
        acme = page.locator('#keys tr[data-key="acme"]')
        expect(acme.locator("td").nth(0)).to_have_text("acme*")
        expect(acme.locator("td").nth(1)).to_have_text("2")  # busy: its per-key cap
        expect(acme.locator("td").nth(2)).to_have_text("1")  # waiting
        expect(acme.locator("td").nth(3)).to_have_text("3")  # weight
        expect(page.locator('#keys tr[data-key="<b>x</b>"] td').nth(0)).to_have_text("<b>x</b>")
        bars = page.locator("#key-chart svg g")
        expect(bars).to_have_count(2)  # one bar per key admitted in the last minute (not <b>x</b>)
        expect(page.locator('#key-chart g[data-key="acme"]')).to_contain_text("2 (50%)")
        expect(page.locator("#keys button")).to_have_count(0)  # locked: no buttons
        answer = _forged(page, "/queues/reports/pause", "bigco")
        assert answer["status"] == 403 and "need the dashboard token" in answer["text"]
        assert not [s for s in fc.backend.key_stats("reports") if s.paused_until]
        shot(page, "tenants-locked")

        page.fill('#mode input[name="token"]', "s3cret")
        page.click('#mode button:text("Unlock")')
        expect(page.locator("#mode")).to_contain_text("Changes are allowed")
        page.locator('#keys tr[data-key="bigco"] button:text("Pause")').click()
        expect(page.locator(".flash")).to_have_text("paused key bigco of reports until resumed")
        expect(page.locator('#keys tr[data-key="bigco"] td.paused')).to_have_text("until resumed")
        assert {s.key: s.paused_until for s in fc.backend.key_stats("reports")}["bigco"] == float("inf")
        shot(page, "tenants-paused")
        page.locator('#keys tr[data-key="bigco"] button:text("Resume")').click()
        expect(page.locator('#keys tr[data-key="bigco"] td.paused')).to_have_text("-")

        page.fill('#queue-pause input[name="for"]', "10m")
        page.click('#queue-pause button:text("Pause queue")')
        expect(page.locator('#figures [data-f="paused"]')).to_contain_text("until ")
        assert fc.backend.stats("reports").paused_until is not None
        page.goto(url)  # the queues page marks it too
        expect(page.locator('#queues tr[data-queue="reports"] [data-f="paused"]')).to_have_text("paused")
        page.goto(f"{url}/queues/reports/keys")
        page.click('#queue-pause button:text("Resume queue")')
        expect(page.locator('#figures [data-f="paused"]')).to_have_text("no")
        api = page.request.get(f"{url}/api/queues/reports/keys").json()
        assert {k["key"] for k in api["keys"]} == {"acme", "bigco", "<b>x</b>"}
        assert api["queue"]["paused"] is False
