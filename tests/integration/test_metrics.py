"""Metrics: counters derived by the sampler, and ``/metrics`` against the backend's own figures.

The sampler's derivations are checked exactly on the in-process backend with a hand-moved clock;
``/metrics`` is scraped from the dashboard app on a real Redis backend, parsed with
``prometheus_client``'s own parser, and compared with what the backend and the parking store say.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.metrics import FlowControlCollector, Sampler
from celery_flowcontrol.parking import ParkedMessage
from tests.support.services import free_port, need_dashboard_module
from tests.support.waiting import inside_one_minute

prometheus = need_dashboard_module("prometheus_client")
need_dashboard_module("flask")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make_fc(conf: dict[str, Any], sqlite_url: str) -> Any:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(flowcontrol_parking_url=sqlite_url, **conf)
    fc = FlowControl(app)
    for config in fc.settings.queues:
        fc.backend.register(config)
    return fc


@pytest.fixture
def memory(sqlite_url: str) -> Iterator[Any]:
    clock = Clock()
    backend = MemoryBackend(clock=clock)
    fc = make_fc({"flowcontrol_backend": backend,
                  "flowcontrol_queues": [{"name": "api", "concurrency": 2},
                                         {"name": "slow", "rate_limit": "2/m"},
                                         {"name": "tenants", "concurrency": 4, "per_key_concurrency": 1,
                                          "per_key_rate_limit": "1/m"}]}, sqlite_url)
    yield SimpleNamespace(fc=fc, backend=backend, clock=clock, sampler=Sampler(fc))
    fc.store.close()


def admit(backend: MemoryBackend, queue: str, task_id: str) -> Any:
    return backend.try_admit(Ticket(queue, task_id, "w1/1/ab"))


def test_admissions_are_counted_from_the_slot_sequence(memory: Any) -> None:
    b, s = memory.backend, memory.sampler
    admit(b, "api", "a")
    s.sample()  # the baseline
    slot_b = admit(b, "api", "b").slot
    b.release(slot_b.slot_id)
    admit(b, "api", "c")  # b came and went between samples: c's slot number still counts it
    sample = s.sample()["api"]
    assert sample.admitted == 2
    assert s.totals()["api"]["admitted"] == 2


def test_first_denials_are_counted_once_with_their_reason(memory: Any) -> None:
    b, s, clock = memory.backend, memory.sampler, memory.clock
    admit(b, "api", "a"), admit(b, "api", "b")
    s.sample()
    admit(b, "api", "c"), admit(b, "api", "d")
    clock.now += 1
    admit(b, "api", "c")  # a waiter that re-checks is not a new denial
    assert s.sample()["api"].denied == {"concurrency": 2}
    admit(b, "slow", "x"), admit(b, "slow", "y")
    s.sample()
    admit(b, "slow", "z")
    assert s.sample()["slow"].denied == {"rate": 1}
    assert s.totals()["api"]["denied"] == {"rate": 0, "concurrency": 2, "key-concurrency": 0, "backoff": 0,
                                           "key-rate": 0, "paused": 0}


def test_a_key_s_own_cap_and_its_own_window_are_told_apart(memory: Any) -> None:
    b, s, clock = memory.backend, memory.sampler, memory.clock
    acme = b.try_admit(Ticket("tenants", "a1", "w1/1/ab", 0, "acme")).slot
    s.sample()
    b.try_admit(Ticket("tenants", "a2", "w1/1/ab", 0, "acme"))  # acme holds its 1 slot
    assert s.sample()["tenants"].denied == {"key-concurrency": 1}
    b.withdraw("tenants", "a2")
    b.release(acme.slot_id)  # acme's slot is free, its 1/m window is not
    clock.now += 1
    d = b.try_admit(Ticket("tenants", "a3", "w1/1/ab", 0, "acme"))
    assert d.reason == "key-rate"
    assert s.sample()["tenants"].denied == {"key-rate": 1}
    assert s.totals()["tenants"]["denied"]["key-rate"] == 1


def test_a_wait_runs_from_the_first_denial_to_the_grant(memory: Any) -> None:
    b, s, clock = memory.backend, memory.sampler, memory.clock
    a = admit(b, "api", "a").slot
    admit(b, "api", "b")
    admit(b, "api", "c")  # denied at t0
    s.sample()
    clock.now += 7.5
    b.release(a.slot_id)  # granted to c at t0 + 7.5
    clock.now += 1.0
    sample = s.sample()["api"]
    assert sample.waits == [7.5]
    totals = s.totals()["api"]
    assert totals["sum"] == 7.5
    assert totals["buckets"][-1] == 1 and totals["buckets"][5] == 0 and totals["buckets"][6] == 1  # <= 10 s


def test_a_pruned_waiter_is_no_wait(memory: Any) -> None:
    b, s, clock = memory.backend, memory.sampler, memory.clock
    admit(b, "api", "a"), admit(b, "api", "b"), admit(b, "api", "c")
    s.sample()
    clock.now += 10_000  # past waiter_ttl: reclaim prunes c (its holders' heartbeat is kept)
    b.heartbeat("w1/1/ab")
    assert b.reclaim().waiters == 1
    assert s.sample()["api"].waits == []


def test_reclaim_passes_are_counted_by_reason(memory: Any) -> None:
    b, clock = memory.backend, memory.clock
    sampler = Sampler(memory.fc, reclaim_every=15)
    admit(b, "api", "a")
    clock.now += 60  # the holder's heartbeat lapsed
    sampler.sample()
    assert sampler.reclaimed_total["instances"] == 1


def test_a_worker_exporter_collector_samples_at_each_scrape(memory: Any) -> None:
    registry = prometheus.CollectorRegistry()
    figures = {"w1@h": {"autoscaler": {"limit": 4, "inflight": 1, "p95_ms": 250.0, "rss_bytes": 1024}}}
    registry.register(FlowControlCollector(memory.fc, memory.sampler, sample_on_collect=True,
                                           workers=lambda: figures))
    admit(memory.backend, "api", "a")
    prometheus.generate_latest(registry)
    admit(memory.backend, "api", "b")
    text = prometheus.generate_latest(registry).decode()
    values = scrape(text)
    assert values[("flowcontrol_admitted_total", (("queue", "api"),))] == 1
    assert values[("flowcontrol_worker_limit", (("worker", "w1@h"),))] == 4
    assert values[("flowcontrol_worker_p95_seconds", (("worker", "w1@h"),))] == 0.25


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


# -- /metrics on a real Redis backend -------------------------------------------------------------


def test_metrics_endpoint_parses_and_matches_the_backend(redis_url: str, key_prefix: str, redis_client: Any,
                                                         sqlite_url: str) -> None:
    from celery_flowcontrol.dashboard import create_app

    inside_one_minute()  # "100/m" is a fixed window: sampled, then read again below
    fc = make_fc({"flowcontrol_backend_url": redis_url, "flowcontrol_key_prefix": key_prefix,
                  "flowcontrol_queues": [{"name": "api", "concurrency": 3, "rate_limit": "100/m"},
                                         {"name": "bulk", "concurrency": 1, "max_hold": "10m"}]},
                 sqlite_url)
    backend = fc.backend
    try:
        for i in range(5):
            backend.try_admit(Ticket("api", f"a{i}", "w1/1/ab"))
        backend.try_admit(Ticket("bulk", "b0", "w1/1/ab"))
        backend.set_capacity("bulk", 2)
        for i in range(3):
            fc.store.park(ParkedMessage(task_id=f"p{i}", queue="api", body=b"{}", wake_at=2e9,
                                        task_name="proj.work", reason="concurrency"))
        app = create_app(fc, sampler=False, worker_timeout=0.1)
        sampler = app.extensions["flowcontrol"]["sampler"]
        sampler.sample()
        backend.release(backend.busy_slots("api")[0].slot_id)  # grants to a3
        backend.try_admit(Ticket("api", "a3", "w1/1/ab"))     # a3 confirms: one admission more
        sampler.sample()
        response = app.test_client().get("/metrics")
        assert response.status_code == 200
        assert response.mimetype == "text/plain"
        values = scrape(response.get_data(as_text=True))
        for name in ("api", "bulk"):
            stats = backend.stats(name)
            q = (("queue", name),)
            assert values[("flowcontrol_in_use", q)] == stats.in_use
            assert values[("flowcontrol_capacity", q)] == stats.capacity
            assert values[("flowcontrol_waiting", q)] == stats.waiting
            assert values[("flowcontrol_granted", q)] == stats.granted
            assert values[("flowcontrol_rate_used", q)] == stats.rate_used
            assert values[("flowcontrol_parked", q)] == fc.store.count(name)
        assert values[("flowcontrol_capacity", (("queue", "bulk"),))] == 2  # the override
        assert values[("flowcontrol_parked", (("queue", "api"),))] == 3
        assert values[("flowcontrol_admitted_total", (("queue", "api"),))] == 1
        assert values[("flowcontrol_wait_seconds_count", (("queue", "api"),))] == 1
        assert values[("flowcontrol_denied_total", (("queue", "api"), ("reason", "concurrency")))] == 0
    finally:
        backend.close()
        fc.store.close()


def test_a_worker_exporter_serves_once_the_worker_is_ready(memory: Any) -> None:
    import urllib.request

    from celery import signals

    from celery_flowcontrol.metrics import start_worker_exporter

    port = free_port()
    app = memory.fc.app
    start_worker_exporter(app, port=port)
    admit(memory.backend, "api", "a")
    # what the worker's consumer sends when it is ready (another app's worker is ignored)
    class Consumer:  # hashable, as a signal sender must be
        def __init__(self, app: Any, hostname: str) -> None:
            self.app, self.hostname, self.controller = app, hostname, None

    signals.worker_ready.send(sender=Consumer(object(), "other@h"))
    signals.worker_ready.send(sender=Consumer(app, "w1@h"))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        values = scrape(r.read().decode())
    assert values[("flowcontrol_in_use", (("queue", "api"),))] == 1
    assert ("flowcontrol_admitted_total", (("queue", "api"),)) in values
