"""How the worker reads flow options from message headers: every bad value has a documented
behaviour and none loses the message (pure logic, no broker)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from celery_flowcontrol.protocol import (
    fit_key,
    fit_priority,
    parse_eta,
    read_burst,
    read_options,
    task_id_of,
    ticket_id,
)

TASK = SimpleNamespace(name="proj.t", flow_queue=None, flow_priority=0, fairness_key=None)
DEFAULTS = SimpleNamespace(name="proj.d", flow_queue="api", flow_priority=3, fairness_key="acme")


def test_no_flow_queue_means_ungated() -> None:
    assert read_options({"id": "x"}, TASK) is None


def test_headers_win_over_decorator_defaults() -> None:
    opts = read_options({"id": "x", "flow_queue": "q2", "flow_priority": 7, "flow_fairness_key": "k"},
                        DEFAULTS)
    assert opts is not None and (opts.queue, opts.priority, opts.key) == ("q2", 7, "k")


def test_the_deprecated_flow_key_header_is_still_read_as_the_fairness_key(
        caplog: pytest.LogCaptureFixture) -> None:
    """A message from an older producer, or one in another language, names the fairness key
    ``flow_key``: it is read (over the decorator default), with one warning per task name."""
    old = SimpleNamespace(name="proj.legacy", flow_queue="api", flow_priority=0,
                          fairness_key="default")
    for _ in range(2):
        opts = read_options({"id": "x", "root_id": "r", "flow_key": "acme"}, old)
        assert opts is not None and opts.key == "acme"
    assert caplog.text.count("deprecated header 'flow_key'") == 1
    assert "flow_fairness_key" in caplog.text


def test_the_fairness_key_header_wins_over_the_deprecated_one() -> None:
    opts = read_options({"id": "x", "flow_queue": "q", "flow_fairness_key": "new",
                         "flow_key": "old"}, TASK)
    assert opts is not None and opts.key == "new"


def test_decorator_defaults_apply_when_headers_are_absent() -> None:
    opts = read_options({"id": "x", "root_id": "r"}, DEFAULTS)
    assert opts is not None and (opts.queue, opts.priority, opts.key) == ("api", 3, "acme")


def test_fairness_key_defaults_to_root_id() -> None:
    opts = read_options({"id": "x", "root_id": "root-1", "flow_queue": "q"}, TASK)
    assert opts is not None and opts.key == "root-1"


@pytest.mark.parametrize("value", ["high", 1.5, True, None, 10**7, -(10**7), [1]],
                         ids=["str", "float", "bool", "none", "huge", "tiny", "list"])
def test_bad_priority_becomes_zero(value: object, caplog: pytest.LogCaptureFixture) -> None:
    assert fit_priority(value, f"task-{value!r}") == 0
    if value is not None:
        assert "flow_priority" in caplog.text


def test_bad_priority_warns_once_per_task(caplog: pytest.LogCaptureFixture) -> None:
    fit_priority("x", "proj.once")
    fit_priority("y", "proj.once")
    assert caplog.text.count("proj.once") == 1


def test_oversized_key_is_hashed_deterministically() -> None:
    big = "t" * 10_000
    assert fit_key(big) == fit_key(big) != fit_key(big + "x")
    assert fit_key(big).startswith("sha256:") and len(fit_key(big)) == 71
    assert fit_key("é" * 128) == "é" * 128  # 256 bytes: fits
    assert fit_key("é" * 129).startswith("sha256:")


def test_key_and_priority_at_their_limits() -> None:
    assert fit_key("k" * 256) == "k" * 256
    assert fit_key("k" * 257).startswith("sha256:")
    assert fit_key("") == ""
    assert fit_priority(1_000_000, "proj.edge") == 1_000_000
    assert fit_priority(-1_000_000, "proj.edge") == -1_000_000
    assert fit_priority(1_000_001, "proj.edge") == 0
    assert fit_priority(False, "proj.edge") == 0  # a bool is not a priority


def test_key_with_a_lone_surrogate_is_hashed() -> None:
    assert fit_key("ab\udc80").startswith("sha256:")


def test_non_str_key_and_queue() -> None:
    assert fit_key(42) == "42"
    assert read_options({"id": "x", "flow_queue": 5}, TASK) is None


def test_eta_parsing() -> None:
    assert parse_eta(None) is None
    assert parse_eta("2026-01-01T00:00:00+00:00") == 1767225600.0
    assert parse_eta("2026-01-01T00:00:00") == 1767225600.0  # naive means UTC, as Celery
    assert parse_eta("garbage") is None


def test_ticket_id_separates_retries() -> None:
    assert ticket_id({"id": "abc"}) == "abc"
    assert ticket_id({"id": "abc", "retries": 0}) == "abc"
    assert ticket_id({"id": "abc", "retries": 2}) == "abc~r2"
    assert task_id_of("abc~r2") == "abc" and task_id_of("abc") == "abc"
    assert task_id_of("a~rb") == "a~rb"


def test_a_debounced_runs_burst_is_read_under_either_name() -> None:
    """``flow_debounce_burst`` is the burst; a dict under ``flow_debounce`` (where a producer
    kept it under the option's name) is read too, and a duration there is not a burst."""
    burst = {"first": 1.0, "calls": 3, "key": "proj.t"}
    assert read_burst({"flow_debounce_burst": burst}) == burst
    assert read_burst({"flow_debounce": burst}) == burst
    assert read_burst({"flow_debounce": "5s"}) is None and read_burst({}) is None
