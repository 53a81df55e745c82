"""The dashboard's Collapsed page in a real headless Chromium: a held unique key, a latest-wins
key, a pending debounce and a batch gathering, made by real calls on the test's Redis backend
and SQLite parking, and an argument that looks like markup shown as text."""

from __future__ import annotations

from typing import Any

from celery_flowcontrol import FlowControl
from tests.e2e.test_dashboard import browser, dashboard, expect, page, shot
from tests.support.projects.collapse import CollapseHarness

__all__ = ["browser", "page"]  # the fixtures of test_dashboard.py, shared

MARKUP = "<img src=x onerror=window.__xss=1>"


def test_the_collapsed_page_shows_held_keys_and_pending_debounces(make_harness: Any,
                                                                  page: Any) -> None:
    h = make_harness(CollapseHarness)
    app = h.app
    held = app.tasks["proj.sync"].delay(42)
    burst = [app.tasks["proj.reindex"].delay(MARKUP, v) for v in range(3)]
    app.tasks["proj.recompute"].delay("board-7", 1)
    newest = app.tasks["proj.recompute"].delay("board-7", 2)
    app.tasks["proj.square"].delay(3)
    with dashboard(FlowControl(app)) as url:
        page.goto(f"{url}/collapsed")
        expect(page.locator("#unique tbody")).to_contain_text(held.id)
        expect(page.locator("#unique tbody")).to_contain_text("proj.sync:[[42],{}]")
        expect(page.locator("#debounce tbody")).to_contain_text(burst[0].id)
        expect(page.locator("#debounce tbody")).to_contain_text(MARKUP)
        expect(page.locator("#debounce tbody td").nth(2)).to_have_text("3")
        expect(page.locator("#latest tbody")).to_contain_text("proj.recompute:board-7")
        expect(page.locator("#latest tbody")).to_contain_text(newest.id)
        expect(page.locator("#batch tbody")).to_contain_text("proj.square")
        assert page.evaluate("window.__xss") is None
        assert page.locator("main img").count() == 0
        shot(page, "collapsed")
    app.close()
