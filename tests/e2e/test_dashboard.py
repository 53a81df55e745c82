"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

The dashboard runs in this process (Werkzeug's threaded server on a free port) on the test's real
Redis backend and SQLite parking table; where a worker is needed it is a real ``celery worker``
from the e2e harness, with the adaptive autoscaler. A screenshot of each page is saved under
``test-output/screenshots/`` (or ``$FLOWCONTROL_TEST_OUTPUT/screenshots/``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import Ticket
from celery_flowcontrol.parking import ParkedMessage
from tests.support.harness import REPO, wait_for
from tests.support.services import in_ci

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = Path(os.environ.get("FLOWCONTROL_TEST_OUTPUT", REPO / "test-output")) / "screenshots"
AUTOSCALER = "celery_flowcontrol.autoscale:AdaptiveAutoscaler"


def _need(what: str, ok: bool) -> None:
    if not ok:
        message = f"{what} is missing (.ci/run installs it: apt-get install chromium; pip install playwright)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (starting it costs about a second)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("playwright", False)
    _need(CHROMIUM, Path(CHROMIUM).exists())
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (own cookies) and page; fails the test on any page error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("dialog", lambda dialog: (errors.append(f"dialog: {dialog.message}"), dialog.dismiss()))
    pg.set_default_timeout(20_000)
    yield pg
    context.close()
    assert not errors, errors


@contextmanager
def dashboard(fc: Any, token: str | None = None, sample_every: float = 0.5) -> Iterator[str]:
    """Serve the dashboard of *fc* on a free loopback port; yields its base URL."""
    from werkzeug.serving import make_server

    from celery_flowcontrol.dashboard import create_app

    app = create_app(fc, token=token, sample_every=sample_every, worker_timeout=0.5)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        app.extensions["flowcontrol"]["thread"].stop()


def shot(pg: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    pw_expect.set_options(timeout=20_000)  # a real worker is slower than Playwright's default 5 s
    return pw_expect(locator)


def flow_world(make_harness: Any, concurrency: int, worker: bool = True) -> tuple[Any, Any]:
    conf = {"flowcontrol_queues": [{"name": "api", "concurrency": concurrency}], "worker_autoscaler": AUTOSCALER}
    h = make_harness(conf=conf)
    if worker:
        h.start_worker(4, extra=["--autoscale=4,2"])
    return h, FlowControl(h.app)


# -- with a real worker ---------------------------------------------------------------------------


@pytest.mark.gated("api")
def test_queues_page_shows_a_queue_filling_while_a_worker_runs_tasks(make_harness: Any, page: Any) -> None:
    h, fc = flow_world(make_harness, concurrency=2)
    with dashboard(fc, token="tok") as url:
        page.goto(url + "/")
        row = page.locator('#queues tr[data-queue="api"]')
        expect(row.locator('[data-f="busy"]')).to_have_text("0 / 2")
        labels = [f"fill-{i}" for i in range(6)]
        for label in labels:
            h.send("gate", label, flow_queue="api")
        # no reload: the page refreshes itself
        expect(row.locator('[data-f="busy"]')).to_have_text("2 / 2")
        expect(row.locator('[data-f="waiting"]')).to_have_text("4")
        expect(row.locator('[data-f="parked"]')).to_have_text("4")
        assert h.gauge.inflight() == 2
        # the charts drew the admissions of the last samples
        page.wait_for_function(
            '() => { const s = document.querySelector(\'#charts [data-queue="api"] [data-chart="rates"]\');'
            " return s && Number(s.dataset.points) >= 3 && s.querySelector('path.admitted').getAttribute('d'); }"
        )
        shot(page, "queues")

        page.click('#queues a:text("api")')
        expect(page.locator("#slots tbody tr")).to_have_count(2)
        expect(page.locator("#waiters tbody tr")).to_have_count(4)
        expect(page.locator("#parked tbody tr")).to_have_count(4)
        expect(page.locator("#slots tbody tr").first).to_contain_text(h.prefix)  # the holder is our worker
        shot(page, "queue")

        page.click('nav a:text("Workers")')
        card = page.locator(f'#workers [data-worker^="{h.prefix}-w1@"]')
        expect(card).to_contain_text("live limit")
        expect(card).to_contain_text("in flight")
        expect(card.locator("dd").first).not_to_have_text("-")
        shot(page, "workers")

        h.gauge.open_gate()
        h.wait_done(labels, timeout=30)
        page.click('nav a:text("Queues")')
        expect(row.locator('[data-f="busy"]')).to_have_text("0 / 2")
        expect(row.locator('[data-f="waiting"]')).to_have_text("0")
        expect(row.locator('[data-f="parked"]')).to_have_text("0")
    assert h.gauge.peak() == 2


@pytest.mark.gated("api")
def test_a_slot_is_released_from_the_queue_page_with_the_token(make_harness: Any, page: Any) -> None:
    h, fc = flow_world(make_harness, concurrency=1)
    h.send("gate", "first", flow_queue="api")
    wait_for(lambda: h.gauge.started() == 1, 20, what="the first task to start")
    h.send("gate", "second", flow_queue="api")
    wait_for(lambda: fc.backend.stats("api").waiting == 1, 20, what="the second task to wait")
    [held] = fc.backend.busy_slots("api")
    with dashboard(fc, token="s3cret") as url:
        page.goto(f"{url}/queues/api")
        expect(page.locator("#mode")).to_contain_text("Read-only until you unlock")
        expect(page.locator("#slots button")).to_have_count(0)
        page.fill('#mode input[name="token"]', "s3cret")
        page.click('#mode button:text("Unlock")')
        expect(page.locator("#mode")).to_contain_text("Changes are allowed")
        page.click(f'#slots tr[data-slot="{held.slot_id}"] button:text("Release")')
        expect(page.locator(".flash")).to_have_text(f"released slot {held.slot_id}")
        # the slot went to the waiter, which the worker now runs (the released task runs on)
        wait_for(lambda: h.gauge.started() == 2, 20, what="the waiter to be woken and run")
        expect(page.locator('#figures [data-f="busy"]')).to_have_text("1 / 1")
        expect(page.locator('#figures [data-f="parked"]')).to_have_text("0")
        expect(page.locator("#waiters tbody tr.empty")).to_have_count(1)
        expect(page.locator("#slots tbody tr[data-slot]")).to_have_count(1)
        expect(page.locator(f'#slots tr[data-slot="{held.slot_id}"]')).to_have_count(0)
        shot(page, "queue-released")
        # and the capacity form works the same way
        page.fill('#capacity-form input[name="value"]', "3")
        page.click('#capacity-form button:text("Set")')
        expect(page.locator(".flash")).to_have_text("capacity of api: 3 (overridden)")
        assert fc.backend.stats("api").capacity_override == 3
    h.gauge.open_gate()
    h.wait_done(["first", "second"], timeout=30)


# -- without a worker -----------------------------------------------------------------------------


def _forged_release(page: Any, slot_id: str) -> dict[str, Any]:
    """POST a release from the page's own origin, with whatever CSRF token the page holds."""
    return page.evaluate(
        """async (slot) => {
            const csrf = document.querySelector('input[name="csrf"]');
            const body = new URLSearchParams({slot_id: slot, csrf: csrf ? csrf.value : ''});
            const r = await fetch('/queues/api/release', {method: 'POST', body});
            return {status: r.status, text: await r.text()};
        }""",
        slot_id,
    )


def test_changes_without_the_token_are_refused(make_harness: Any, page: Any) -> None:
    h, fc = flow_world(make_harness, concurrency=1, worker=False)
    fc.register_queue(fc.settings.queues[0])
    slot = fc.backend.try_admit(Ticket("api", "held-1", "w1/1/ab")).slot
    with dashboard(fc, token=None) as url:  # no token at all: read-only
        page.goto(f"{url}/queues/api")
        expect(page.locator("#mode")).to_contain_text("Read-only: no token is set")
        expect(page.locator("#slots button")).to_have_count(0)
        expect(page.locator("#capacity-form")).to_have_count(0)
        shot(page, "read-only")
        answer = _forged_release(page, slot.slot_id)
        assert answer["status"] == 403 and "read-only" in answer["text"]
    with dashboard(fc, token="s3cret") as url:  # a token, but this browser never gave it
        page.goto(f"{url}/queues/api")
        answer = _forged_release(page, slot.slot_id)
        assert answer["status"] == 403 and "need the dashboard token" in answer["text"]
        page.fill('#mode input[name="token"]', "guess")
        page.click('#mode button:text("Unlock")')
        expect(page.locator("#refused")).to_have_text("wrong token")
        shot(page, "refused")
    assert [s.slot_id for s in fc.backend.busy_slots("api")] == [slot.slot_id]


XSS = '<img src=x onerror="window.__xss=1">'


def test_an_xss_label_is_shown_as_text(make_harness: Any, page: Any) -> None:
    h, fc = flow_world(make_harness, concurrency=1, worker=False)
    fc.register_queue(fc.settings.queues[0])
    key = "<script>window.__xss=2</script>"
    fc.backend.try_admit(Ticket("api", "t-1", "w1/1/ab", fairness_key=key, label=XSS))
    fc.backend.try_admit(Ticket("api", "t-2", "w1/1/ab", fairness_key=key, label=XSS))
    fc.store.park(
        ParkedMessage(
            task_id="t-2",
            queue="api",
            body=b"{}",
            wake_at=2e9,
            task_name="<svg onload=window.__xss=3>",
            reason="concurrency",
            fairness_key=key,
        )
    )
    with dashboard(fc, token="s3cret") as url:
        page.goto(f"{url}/queues/api")
        expect(page.locator("#slots td.label")).to_have_text(XSS)
        expect(page.locator("#waiters td.label")).to_have_text(XSS)
        expect(page.locator("#parked tbody")).to_contain_text("<svg onload=window.__xss=3>")
        expect(page.locator("#slots tbody")).to_contain_text(key)
        page.wait_for_timeout(1500)  # let the page refresh itself a few times
        expect(page.locator("#slots td.label")).to_have_text(XSS)
        assert page.evaluate("window.__xss") is None
        assert page.locator("#slots img, #waiters img, #parked svg, main script").count() == 0
        shot(page, "xss-label")
