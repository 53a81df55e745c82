"""The tenant metrics (metrics_tenants.py) of one scrape, on the in-process backend the test also
holds: the paused gauge and the refusals counter per queue, and per-key series only for keys with
settings of their own or a pause, however many keys call."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from celery_flowcontrol.admission import MemoryBackend, Ticket
from celery_flowcontrol.metrics import FlowControlCollector
from celery_flowcontrol.views.tenant_rows import pause, set_key_text
from tests.integration.test_metrics import make_fc
from tests.support.services import need_dashboard_module

need_dashboard_module("prometheus_client")

QUEUE = {"name": "reports", "concurrency": 3, "fairness": "key", "per_key_concurrency": 1,
         "per_key_max_waiting": 1, "keys": {"acme": {"weight": 3}}}


@pytest.fixture
def fc(sqlite_url: str) -> Iterator[Any]:
    fc = make_fc({"flowcontrol_backend": MemoryBackend(), "flowcontrol_queues": [QUEUE]}, sqlite_url)
    yield fc
    fc.store.close()


def scrape(fc: Any) -> dict[str, dict[tuple[str, ...], float]]:
    """Family name -> {label values: value}, as one scrape of the collector gives them."""
    out: dict[str, dict[tuple[str, ...], float]] = {}
    for family in FlowControlCollector(fc).collect():
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sample.labels.values())] = sample.value
    return out


def test_per_key_series_only_for_keys_with_settings_or_a_pause(fc: Any) -> None:
    b = fc.backend
    for i in range(50):  # fifty tenants call: none of them gets a series of its own
        b.try_admit(Ticket("reports", f"t{i}", "w1", fairness_key=f"tenant-{i}"))
    b.try_admit(Ticket("reports", "a1", "w1", fairness_key="acme"))
    first = scrape(fc)
    assert set(first["flowcontrol_key_weight"]) == {("reports", "acme")}
    assert first["flowcontrol_key_weight"][("reports", "acme")] == 3
    assert first["flowcontrol_paused"] == {("reports",): 0.0}
    set_key_text(fc, "reports", "tenant-7", {"concurrency": 2})
    pause(fc, "reports", "tenant-9", None)
    second = scrape(fc)
    assert set(second["flowcontrol_key_busy"]) == {("reports", "acme"), ("reports", "tenant-7"),
                                                   ("reports", "tenant-9")}
    assert second["flowcontrol_key_paused"][("reports", "tenant-9")] == 1


def test_the_paused_gauge_and_the_refusals_counter(fc: Any) -> None:
    b = fc.backend
    b.try_admit(Ticket("reports", "a1", "w1", fairness_key="acme"))
    b.try_admit(Ticket("reports", "a2", "w1", fairness_key="acme"))  # waits: acme's bound is 1
    refused = b.try_admit(Ticket("reports", "a3", "w1", fairness_key="acme"))
    assert type(refused).__name__ == "Refused"
    until = pause(fc, "reports", None, "10m")
    out = scrape(fc)
    assert out["flowcontrol_paused"] == {("reports",): 1.0}
    assert out["flowcontrol_paused_until"][("reports",)] == pytest.approx(until)
    assert out["flowcontrol_refused_total"] == {("reports",): 1.0}
    pause(fc, "reports", None, None)  # until resumed: no end to show
    out = scrape(fc)
    assert ("reports",) not in out.get("flowcontrol_paused_until", {}) and math.isinf(
        b.stats("reports").paused_until)
