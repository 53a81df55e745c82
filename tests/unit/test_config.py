"""QueueConfig, RateLimit and durations: every accepted form, and every rejection naming its field."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import timedelta
from typing import Any

import pytest

from celery_flowcontrol.config import (
    MAX_CONCURRENCY,
    MAX_HOLD_LIMIT,
    QueueConfig,
    RateLimit,
    parse_duration,
    parse_queues,
)
from celery_flowcontrol.errors import FlowControlConfigError, FlowControlError


def q(**fields: Any) -> dict[str, Any]:
    """An entry for queue 'q' with *fields*."""
    return {"name": "q", **fields}


def rate(**fields: Any) -> dict[str, Any]:
    """An entry for queue 'q' whose rate_limit dict is 5 per 1 s overridden by *fields*."""
    return q(rate_limit={"limit": 5, "period": 1, **fields})


# --- rejections: one row per rule; (entry given to QueueConfig.from_value, field named, given shown)
REJECTIONS = [
    pytest.param({"name": "my queue"}, "name", "'my queue'", id="name-space"),
    pytest.param({"name": "a{b}"}, "name", "'a{b}'", id="name-braces"),
    pytest.param({"name": "a:b"}, "name", "'a:b'", id="name-colon"),
    pytest.param({"name": "a/b"}, "name", "'a/b'", id="name-slash"),
    pytest.param({"name": "Emails"}, "name", "'Emails'", id="name-upper-case"),
    pytest.param({"name": ""}, "name", "''", id="name-empty"),
    pytest.param({"name": "a" * 65}, "name", "'" + "a" * 65 + "'", id="name-over-64"),
    pytest.param({"name": "é"}, "name", "'é'", id="name-non-ascii"),
    pytest.param({"name": 5}, "name", "got 5", id="name-not-str"),
    pytest.param({"name": None}, "name", "got None", id="name-none"),
    pytest.param({"concurrency": 5}, "name", "is required", id="name-missing"),
    pytest.param(q(concurrency=0), "concurrency", "got 0", id="concurrency-zero"),
    pytest.param(q(concurrency=-3), "concurrency", "got -3", id="concurrency-negative"),
    pytest.param(q(concurrency=True), "concurrency", "got True", id="concurrency-bool"),
    pytest.param(q(concurrency=2.0), "concurrency", "got 2.0", id="concurrency-float"),
    pytest.param(q(concurrency="5"), "concurrency", "got '5'", id="concurrency-str"),
    pytest.param(q(concurrency=MAX_CONCURRENCY + 1), "concurrency", "got 100001", id="concurrency-over-max"),
    pytest.param(rate(limit=0), "rate_limit.limit", "got 0", id="limit-zero"),
    pytest.param(rate(limit=-1), "rate_limit.limit", "got -1", id="limit-negative"),
    pytest.param(rate(limit=True), "rate_limit.limit", "got True", id="limit-bool"),
    pytest.param(rate(limit=1.5), "rate_limit.limit", "got 1.5", id="limit-float"),
    pytest.param(q(rate_limit="0/m"), "rate_limit.limit", "got 0", id="limit-zero-string"),
    pytest.param(q(rate_limit={"period": 1}), "rate_limit.limit", "is required", id="limit-missing"),
    pytest.param(rate(period=0), "rate_limit.period", "got 0", id="period-zero"),
    pytest.param(rate(period=-1), "rate_limit.period", "got -1", id="period-negative"),
    pytest.param(rate(period="-5s"), "rate_limit.period", "'-5s'", id="period-negative-str"),
    pytest.param(q(rate_limit="5/0s"), "rate_limit.period", "'0s'", id="period-zero-string"),
    pytest.param(q(rate_limit={"limit": 5}), "rate_limit.period", "is required", id="period-missing"),
    pytest.param(rate(algorithm="leaky"), "rate_limit.algorithm", "'leaky'", id="algorithm-unknown"),
    pytest.param(rate(algorithm="gcra", burst=0), "rate_limit.burst", "got 0", id="burst-below-1"),
    pytest.param(rate(burst=3), "rate_limit.burst", "only for algorithm 'gcra'", id="burst-with-fixed"),
    pytest.param(
        rate(algorithm="sliding", burst=3),
        "rate_limit.burst",
        "got algorithm 'sliding'",
        id="burst-with-sliding",
    ),
    pytest.param(rate(every=2), "rate_limit.every", "'every'", id="rate-limit-unknown-key"),
    pytest.param(q(rate_limit="fast"), "rate_limit", "'fast'", id="rate-limit-garbage"),
    pytest.param(q(rate_limit="100"), "rate_limit", "'100'", id="rate-limit-no-period"),
    pytest.param(q(rate_limit="100/w"), "rate_limit", "'100/w'", id="rate-limit-unknown-unit"),
    pytest.param(q(rate_limit=100), "rate_limit", "got 100", id="rate-limit-wrong-type"),
    pytest.param(q(retry=0), "retry", "got 0", id="retry-zero"),
    pytest.param(q(retry=-1.5), "retry", "got -1.5", id="retry-negative"),
    pytest.param(q(retry="soon"), "retry", "'soon'", id="retry-garbage"),
    pytest.param(q(retry=False), "retry", "got False", id="retry-bool"),
    pytest.param(q(retry=math.nan), "retry", "got nan", id="retry-nan"),
    pytest.param(q(fairness="random"), "fairness", "'random'", id="fairness-unknown"),
    pytest.param(q(order="random"), "order", "'random'", id="order-unknown"),
    pytest.param(q(order=None), "order", "got None", id="order-none"),
    pytest.param(q(release="auto"), "release", "'auto'", id="release-unknown"),
    pytest.param(q(release="manual"), "max_hold", "release='manual'", id="manual-without-max-hold"),
    pytest.param(q(max_hold="31d"), "max_hold", "'31d'", id="max-hold-over-30-days"),
    pytest.param(q(max_hold=MAX_HOLD_LIMIT + 1), "max_hold", "2592001", id="max-hold-just-over"),
    pytest.param(q(max_hold=0), "max_hold", "got 0", id="max-hold-zero"),
    pytest.param(q(max_hold=-60), "max_hold", "got -60", id="max-hold-negative"),
    pytest.param(q(per_key_concurrency=0), "per_key_concurrency", "got 0", id="per-key-zero"),
    pytest.param(
        q(concurrency=5, per_key_concurrency=6),
        "per_key_concurrency",
        "concurrency (5), got 6",
        id="per-key-above-concurrency",
    ),
    pytest.param(q(concurency=5), "concurency", "did you mean 'concurrency'", id="unknown-key"),
]


@pytest.mark.parametrize(("entry", "field", "given"), REJECTIONS)
def test_each_invalid_entry_is_rejected_naming_queue_field_and_value(
    entry: dict, field: str, given: str
) -> None:
    with pytest.raises(FlowControlConfigError) as caught:
        QueueConfig.from_value(entry)
    err = caught.value
    name = entry.get("name")
    assert err.field == field
    assert err.queue == (name if isinstance(name, str) else None)
    message = str(err)
    assert f"field {field!r}" in message
    if err.queue is not None:
        assert message.startswith(f"flow queue {err.queue!r}: ")
    assert given in message


PARSE_QUEUES_REJECTIONS = [
    pytest.param(
        [{"name": "a"}, {"name": "b"}, {"name": "a"}], "a", "name", "entries 0 and 2", id="duplicate-name"
    ),
    pytest.param(
        [QueueConfig("a"), {"name": "a", "concurrency": 2}],
        "a",
        "name",
        "entries 0 and 1",
        id="duplicate-mixed",
    ),
    pytest.param({"name": "a"}, None, "flowcontrol_queues", "must be a list", id="single-dict-not-list"),
    pytest.param("a,b", None, "flowcontrol_queues", "'a,b'", id="string-not-list"),
    pytest.param(5, None, "flowcontrol_queues", "got 5", id="int-not-list"),
    pytest.param([{"name": "a"}, "b"], None, "flowcontrol_queues[1]", "got 'b'", id="entry-not-dict"),
    pytest.param([{"name": "a", "fairness": "lottery"}], "a", "fairness", "'lottery'", id="entry-invalid"),
]


@pytest.mark.parametrize(("values", "queue", "field", "given"), PARSE_QUEUES_REJECTIONS)
def test_parse_queues_rejects(values: Any, queue: str | None, field: str, given: str) -> None:
    with pytest.raises(FlowControlConfigError) as caught:
        parse_queues(values)
    assert (caught.value.queue, caught.value.field) == (queue, field)
    assert f"field {field!r}" in str(caught.value) and given in str(caught.value)


def test_config_errors_are_flowcontrol_and_value_errors() -> None:
    with pytest.raises(FlowControlError):
        QueueConfig("q", concurrency=0)
    with pytest.raises(ValueError):
        QueueConfig("q", concurrency=0)
    assert str(pytest.raises(FlowControlConfigError, QueueConfig, "emails", concurrency=0).value) == (
        "flow queue 'emails': field 'concurrency': must be an int between 1 and 100000, got 0"
    )


def test_from_value_rejects_non_mapping() -> None:
    with pytest.raises(FlowControlConfigError) as caught:
        QueueConfig.from_value(["emails"])
    assert (caught.value.queue, caught.value.field) == (None, "config")


# --- accepted forms
DURATIONS = [
    pytest.param(90, 90.0, id="int"),
    pytest.param(1.5, 1.5, id="float"),
    pytest.param("90s", 90.0, id="seconds"),
    pytest.param("45m", 2700.0, id="minutes"),
    pytest.param("2h", 7200.0, id="hours"),
    pytest.param("1.5h", 5400.0, id="fractional-hours"),
    pytest.param("1d", 86400.0, id="days"),
    pytest.param("250ms", 0.25, id="milliseconds"),
    pytest.param("30", 30.0, id="numeric-string"),
    pytest.param("0.5", 0.5, id="numeric-string-float"),
    pytest.param(".5s", 0.5, id="leading-dot"),
    pytest.param(" 10s ", 10.0, id="surrounding-space"),
    pytest.param(timedelta(minutes=2), 120.0, id="timedelta"),
]


@pytest.mark.parametrize(("value", "seconds"), DURATIONS)
def test_parse_duration_accepts(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds
    assert isinstance(parse_duration(value), float)


@pytest.mark.parametrize(
    "value",
    [
        True,
        0,
        -1,
        "0s",
        "-5s",
        "abc",
        "5x",
        "5 s",
        "5S",
        "",
        math.inf,
        math.nan,
        None,
        [5],
        timedelta(0),
        10**400,
    ],
    ids=lambda value: repr(value)[:20],
)
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(FlowControlConfigError) as caught:
        parse_duration(value, queue="q", field="retry")
    assert (caught.value.queue, caught.value.field) == ("q", "retry")
    assert "'90s', '45m', '2h', '1d'" in str(caught.value)


def test_parse_duration_allows_zero_only_when_asked() -> None:
    assert parse_duration(0, allow_zero=True) == 0.0
    assert parse_duration("0s", allow_zero=True) == 0.0
    with pytest.raises(FlowControlConfigError, match=">= 0"):
        parse_duration(-1, allow_zero=True)


RATES = [
    pytest.param("100/m", RateLimit(100, 60.0), id="per-minute"),
    pytest.param("10/s", RateLimit(10, 1.0), id="per-second"),
    pytest.param("1000/h", RateLimit(1000, 3600.0), id="per-hour"),
    pytest.param("5/d", RateLimit(5, 86400.0), id="per-day"),
    pytest.param("20/2s", RateLimit(20, 2.0), id="count-with-unit"),
    pytest.param("20/90s", RateLimit(20, 90.0), id="count-90s"),
    pytest.param("3/1.5h", RateLimit(3, 5400.0), id="fractional-count"),
    pytest.param("4/250ms", RateLimit(4, 0.25), id="milliseconds"),
    pytest.param({"limit": 5, "period": 2}, RateLimit(5, 2.0), id="dict"),
    pytest.param(
        {"limit": 5, "period": "2m", "algorithm": "sliding"},
        RateLimit(5, 120.0, "sliding"),
        id="dict-duration",
    ),
    pytest.param(
        {"limit": 5, "period": 1, "algorithm": "gcra", "burst": 3},
        RateLimit(5, 1.0, "gcra", 3),
        id="dict-gcra-burst",
    ),
    pytest.param(RateLimit(7, "1m", "gcra"), RateLimit(7, 60.0, "gcra"), id="ratelimit"),
]


@pytest.mark.parametrize(("value", "expected"), RATES)
def test_rate_limit_parse_accepts(value: object, expected: RateLimit) -> None:
    rate = RateLimit.parse(value)
    assert rate == expected
    assert RateLimit.parse(rate.to_dict()) == rate


def test_queue_config_defaults() -> None:
    config = QueueConfig("emails")
    assert config.to_dict() == {
        "name": "emails",
        "concurrency": None,
        "rate_limit": None,
        "retry": 1.0,
        "fairness": "fifo",
        "order": "fifo",
        "per_key_concurrency": None,
        "release": "on_result",
        "max_hold": None,
        "per_key_rate_limit": None,
        "per_key_reserve": None,
        "per_key_max_waiting": None,
        "max_waiting": None,
        "keys": {},
    }


def test_queue_config_normalises_loose_forms() -> None:
    config = QueueConfig(
        "tenant.reports-v2_x",
        concurrency=MAX_CONCURRENCY,
        rate_limit="100/m",
        retry="250ms",
        fairness="key",
        order="lifo",
        per_key_concurrency=MAX_CONCURRENCY,
        release="manual",
        max_hold="30d",
    )
    assert config.rate_limit == RateLimit(100, 60.0)
    assert (config.retry, config.max_hold) == (0.25, MAX_HOLD_LIMIT)
    assert QueueConfig("a" * 64, concurrency=1, per_key_concurrency=1).name == "a" * 64


ROUND_TRIPS = [
    pytest.param(QueueConfig("plain"), id="defaults"),
    pytest.param(
        QueueConfig("c", concurrency=3, per_key_concurrency=2, fairness="key", order="lifo"), id="concurrency"
    ),
    pytest.param(
        QueueConfig("r", rate_limit={"limit": 9, "period": "1.5h", "algorithm": "gcra", "burst": 4}),
        id="gcra",
    ),
    pytest.param(QueueConfig("m", concurrency=1, release="manual", max_hold=45.5, retry="2m"), id="manual"),
]


@pytest.mark.parametrize("config", ROUND_TRIPS)
def test_to_dict_from_value_round_trip(config: QueueConfig) -> None:
    data = config.to_dict()
    assert QueueConfig.from_value(data) == config
    assert QueueConfig(**data) == config
    assert QueueConfig.from_value(json.loads(json.dumps(data))) == config  # JSON-safe, for CLI and dashboard
    assert QueueConfig.from_value(config) is config


def test_queue_config_is_frozen_hashable_and_replace_validates() -> None:
    config = QueueConfig("q", concurrency=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.concurrency = 3  # type: ignore[misc]
    assert {config, QueueConfig("q", concurrency=2)} == {config}
    assert dataclasses.replace(config, concurrency=5).concurrency == 5
    with pytest.raises(FlowControlConfigError) as caught:
        dataclasses.replace(config, per_key_concurrency=3)
    assert caught.value.field == "per_key_concurrency"


def test_parse_queues_keeps_order_and_accepts_mixed_entries() -> None:
    queues = parse_queues(
        ({"name": "b"}, QueueConfig("a", concurrency=1), {"name": "c", "rate_limit": "5/s"})
    )
    assert list(queues) == ["b", "a", "c"]
    assert queues["a"].concurrency == 1 and queues["c"].rate_limit == RateLimit(5, 1.0)
    assert parse_queues(None) == {} and parse_queues([]) == {}
