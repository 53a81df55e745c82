"""The dashboard over HTTP without a browser: the token, CSRF, refusals, headers, JSON and history.

Flask's test client on an in-process backend; quick, so every refusal path is covered here and the
browser tests (test_dashboard.py) can stay few.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.metrics import QueueSample
from tests.support.services import need_dashboard_module

need_dashboard_module("flask")
from celery_flowcontrol.dashboard import create_app  # noqa: E402
from celery_flowcontrol.dashboard.history import History, percentile  # noqa: E402
from celery_flowcontrol.views.queues import queue_rows  # noqa: E402

TOKEN = "s3cret-token"


@pytest.fixture
def world(sqlite_url: str) -> Iterator[Any]:
    backend = MemoryBackend()
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_queues=[{"name": "api", "concurrency": 1}, {"name": "other", "concurrency": 1}],
                    flowcontrol_backend=backend, flowcontrol_parking_url=sqlite_url,
                    flowcontrol_dashboard_token=TOKEN)
    fc = FlowControl(app)
    for config in fc.settings.queues:
        backend.register(config)
    slot = backend.try_admit(Ticket("api", "held", "w1/1/ab")).slot
    backend.try_admit(Ticket("api", "waiting", "w1/1/ab"))
    yield SimpleNamespace(fc=fc, backend=backend, slot=slot)
    fc.store.close()


def client(world: Any, token: str | None = "settings") -> Any:
    kwargs = {} if token == "settings" else {"token": token}
    return create_app(world.fc, sampler=False, worker_timeout=0.05, **kwargs).test_client()


def csrf_of(page: bytes) -> str:
    match = re.search(rb'name="csrf" value="([^"]+)"', page)
    assert match, page[:500]
    return match.group(1).decode()


def unlocked(world: Any) -> tuple[Any, str]:
    c = client(world)
    csrf = csrf_of(c.get("/queues/api").data)
    assert c.post("/unlock", data={"csrf": csrf, "token": TOKEN, "next": "/queues/api"}).status_code == 303
    return c, csrf


def refusal(response: Any) -> str:
    match = re.search(rb'id="refused">([^<]*)<', response.data)
    assert match, response.data[:800]
    return html.unescape(match.group(1).decode())


def test_the_token_comes_from_the_settings_and_unlocks_changes(world: Any) -> None:
    c, csrf = unlocked(world)
    page = c.get("/queues/api").data
    assert b"Changes are allowed" in page and b"Release" in page
    r = c.post("/queues/api/release", data={"csrf": csrf, "slot_id": world.slot.slot_id})
    assert r.status_code == 303 and r.headers["Location"].endswith("/queues/api")
    assert b"released slot api:1" in c.get("/queues/api").data
    assert world.backend.stats("api").granted == 1  # the waiter got it


def test_without_a_token_the_dashboard_is_read_only(world: Any) -> None:
    c = client(world, token="")  # "" overrides the setting: no token at all
    c.get("/queues/api")  # the banner; also a session with a CSRF token
    page = c.get("/queues/api").data
    assert b"Read-only: no token is set" in page and b"Release" not in page
    assert b'name="csrf"' not in page  # nothing to submit
    r = c.post("/queues/api/release", data={"slot_id": world.slot.slot_id})
    assert r.status_code == 403 and "read-only" in refusal(r)
    r = c.post("/unlock", data={"token": TOKEN})
    assert r.status_code == 403 and "read-only" in refusal(r)
    assert world.backend.stats("api").in_use == 1


def test_a_locked_session_is_refused(world: Any) -> None:
    c = client(world)
    csrf = csrf_of(c.get("/").data)
    r = c.post("/queues/api/capacity", data={"csrf": csrf, "value": "9"})
    assert r.status_code == 403 and refusal(r) == "changes need the dashboard token: unlock this session first"
    r = c.post("/unlock", data={"csrf": csrf, "token": "guess"})
    assert r.status_code == 403 and refusal(r) == "wrong token"
    assert world.backend.stats("api").capacity == 1


def test_forms_need_the_sessions_csrf_token(world: Any) -> None:
    c, _ = unlocked(world)
    for data in ({"slot_id": "api:1"}, {"slot_id": "api:1", "csrf": "forged"}):
        r = c.post("/queues/api/release", data=data)
        assert r.status_code == 400 and "CSRF" in refusal(r)
    # even unlocking needs it (no login CSRF)
    assert client(world).post("/unlock", data={"token": TOKEN}).status_code == 400
    assert world.backend.stats("api").in_use == 1


def test_a_script_uses_a_bearer_token_and_gets_json(world: Any) -> None:
    c = client(world)
    ok = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json"}
    r = c.post("/queues/api/max-hold", data={"value": "30m"}, headers=ok)
    assert r.status_code == 200 and r.json == {"ok": True, "message": "max hold of api: 30m00s (overridden)"}
    bad = {"Authorization": "Bearer nope", "Accept": "application/json"}
    r = c.post("/queues/api/max-hold", data={"value": "reset"}, headers=bad)
    assert r.status_code == 403 and "token" in r.json["error"]
    assert world.backend.stats("api").max_hold == 1800.0


@pytest.mark.parametrize(("path", "value", "status", "says"), [
    ("/queues/api/capacity", "lots", 400, "field 'capacity'"),
    ("/queues/api/max-hold", "0", 400, "field 'max_hold'"),
    ("/queues/nope/capacity", "3", 404, "flow queue 'nope': is not registered"),
])
def test_bad_changes_say_why_in_one_line(world: Any, path: str, value: str, status: int, says: str) -> None:
    c, csrf = unlocked(world)
    r = c.post(path, data={"csrf": csrf, "value": value})
    assert r.status_code == status and says in refusal(r)


def test_a_slot_is_released_only_from_its_own_queue_page(world: Any) -> None:
    c, csrf = unlocked(world)
    r = c.post("/queues/other/release", data={"csrf": csrf, "slot_id": world.slot.slot_id})
    assert r.status_code == 400 and "is not a slot of 'other'" in refusal(r)
    r = c.post("/queues/api/release", data={"csrf": csrf, "slot_id": "api:77"})
    assert r.status_code == 400 and "is not busy" in refusal(r)


def test_capacity_reset_and_empty_value_reset(world: Any) -> None:
    c, csrf = unlocked(world)
    c.post("/queues/api/capacity", data={"csrf": csrf, "value": "4"})
    assert world.backend.stats("api").capacity_override == 4
    c.post("/queues/api/capacity", data={"csrf": csrf, "value": "reset"})
    assert world.backend.stats("api").capacity_override is None


def test_unlock_redirects_only_inside_the_dashboard(world: Any) -> None:
    c = client(world)
    csrf = csrf_of(c.get("/").data)
    assert c.post("/unlock", data={"csrf": csrf, "token": TOKEN, "next": "//evil.example/"}).status_code == 400


def test_pages_carry_security_headers_and_a_strict_session_cookie(world: Any) -> None:
    c = client(world)
    r = c.get("/")
    assert "script-src 'self'" in r.headers["Content-Security-Policy"]
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_unknown_queue_pages_are_404_with_one_line(world: Any) -> None:
    c = client(world)
    r = c.get("/queues/nope")
    assert r.status_code == 404 and refusal(r) == "flow queue 'nope': is not registered"
    r = c.get("/api/queues/nope")
    assert r.status_code == 404 and r.json == {"error": "flow queue 'nope': is not registered"}


def test_json_endpoints(world: Any) -> None:
    c = client(world)
    data = c.get("/api/queues").json
    assert [q["name"] for q in data["queues"]] == ["api", "other"]
    one = c.get("/api/queues/api").json
    assert [s["slot_id"] for s in one["slots"]] == ["api:1"] and [w["task_id"] for w in one["waiters"]] == ["waiting"]
    assert c.get("/api/workers").json == {"workers": {}}
    assert b"No worker answered" in c.get("/workers").data


def test_history_keeps_a_window_of_points_per_queue(world: Any) -> None:
    rows = {r.name: r for r in queue_rows(world.fc)}
    history = History(every=2.0, window=6.0)
    for i in range(6):
        history.add({"api": QueueSample(100.0 + 2 * i, rows["api"], admitted=4, denied={"concurrency": 2},
                                        waits=[1.0, 2.0, 3.0, 10.0])})
    s = history.series("api")["api"]
    assert s["t"] == [106.0, 108.0, 110.0]  # 3 points = 6 s; the first pass only set the baseline
    assert s["admitted"] == [2.0] * 3 and s["denied"] == [1.0] * 3
    assert s["p50"] == [2.0] * 3 and s["p95"] == [10.0] * 3
    history.add({})
    assert history.series() == {}


def test_percentiles_by_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 95) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 95)) == (50.0, 95.0)
