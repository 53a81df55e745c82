"""A running unique call's key: held on a short lease renewed by the running process, for at
most the key's TTL; freed when the run ends, kept (on its full TTL) by a retry. In-process
claims (``memory://``), real time on short leases."""

from __future__ import annotations

import time

from celery import Celery

from celery_flowcontrol import FlowControl
from celery_flowcontrol.collapse.landing import UniqueLeases
from celery_flowcontrol.collapse.wiring import claims_of


def make_app(tmp_path: object) -> Celery:
    app = Celery("t", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_backend_url="memory://",
                    flowcontrol_parking_url=f"sqlite:///{tmp_path}/p.sqlite3")
    FlowControl(app)
    return app


def test_a_run_holds_its_key_on_a_renewed_lease_until_its_ttl(tmp_path: object) -> None:
    app = make_app(tmp_path)
    claims = claims_of(app)
    leases = UniqueLeases(app, lease=0.6)  # renewed every 0.2 s
    leases.start("k", "run-1", ttl=1.5)
    time.sleep(1.0)  # past the first lease: renewed
    assert claims.holder("unique", "k") == "run-1"
    time.sleep(1.0)  # past the TTL: renewal stopped, and no lease outlives the TTL
    assert claims.holder("unique", "k") is None


def test_the_end_of_a_run_frees_its_key_and_a_retry_keeps_it(tmp_path: object) -> None:
    app = make_app(tmp_path)
    claims = claims_of(app)
    leases = UniqueLeases(app, lease=5.0)
    leases.start("a", "run-a", ttl=60)
    leases.finish("a", "run-a", retry=False, ttl=60)
    assert claims.holder("unique", "a") is None
    leases.start("b", "run-b", ttl=60)
    leases.finish("b", "run-b", retry=True, ttl=60)
    held = {h.collapse_key: h for h in claims.held("unique")}
    assert held["b"].task_id == "run-b" and (held["b"].ttl or 0) > 50


def test_a_redelivered_run_never_takes_a_key_a_later_call_holds(tmp_path: object) -> None:
    app = make_app(tmp_path)
    claims = claims_of(app)
    claims.claim("unique", "k", "later-call", 60)
    leases = UniqueLeases(app, lease=5.0)
    leases.start("k", "redelivered", ttl=60)
    leases.finish("k", "redelivered", retry=False, ttl=60)
    assert claims.holder("unique", "k") == "later-call"
