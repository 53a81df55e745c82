"""Several limits at once, costs and per-key windows in a queue's config.

``rate_limit`` and ``per_key_rate_limit`` take one limit or a list of them, in every form one
limit takes (a string, a dict, a RateLimit); ``per`` and ``adaptive`` are validated like the
other fields, and every bad value names the queue and the entry at fault.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from celery_flowcontrol.config import MAX_RATE_LIMITS, QueueConfig, RateLimit, parse_queues
from celery_flowcontrol.errors import FlowControlConfigError


def test_a_list_of_limits_in_every_form() -> None:
    config = QueueConfig(
        "openai", concurrency=50,
        rate_limit=["500/m", "10000/d", {"limit": 200_000, "period": "1m", "per": "cost"},
                    RateLimit(5, 1, "gcra", burst=5)],
        per_key_rate_limit="20/m", per_key_concurrency=5)
    assert config.rate_limit == (
        RateLimit(500, 60.0), RateLimit(10_000, 86_400.0), RateLimit(200_000, 60.0, per="cost"),
        RateLimit(5, 1.0, "gcra", 5))
    assert config.rate_limits == config.rate_limit
    assert config.per_key_rate_limit == RateLimit(20, 60.0)
    assert config.per_key_rate_limits == (RateLimit(20, 60.0),)


def test_one_limit_keeps_its_shape() -> None:
    """One limit stays one RateLimit (what readers of rate_limit always saw); rate_limits is a
    tuple either way, empty for none."""
    assert QueueConfig("q", rate_limit="5/s").rate_limit == RateLimit(5, 1.0)
    assert QueueConfig("q", rate_limit="5/s").rate_limits == (RateLimit(5, 1.0),)
    assert QueueConfig("q", rate_limit=["5/s"]).rate_limit == (RateLimit(5, 1.0),)
    assert QueueConfig("q").rate_limits == () and QueueConfig("q").per_key_rate_limits == ()


def test_per_and_adaptive() -> None:
    r = RateLimit(100, "1m", per="cost", adaptive=True)
    assert (r.per, r.adaptive, r.max_charge) == ("cost", True, 100)
    assert RateLimit(10, 1, "gcra", burst=3).max_charge == 3
    assert RateLimit.parse({"limit": 3, "period": 1, "adaptive": True}).adaptive is True
    assert RateLimit.parse(r.to_dict()) == r


@pytest.mark.parametrize("config", [
    QueueConfig("a", rate_limit=["5/s", {"limit": 100, "period": 60, "per": "cost"}],
                per_key_rate_limit=["2/s", "10/m"]),
    QueueConfig("b", rate_limit=RateLimit(9, 3, "sliding", adaptive=True),
                per_key_rate_limit={"limit": 4, "period": 1, "algorithm": "gcra", "burst": 2,
                                    "per": "cost"}),
], ids=["lists", "single"])
def test_round_trip_through_plain_data(config: QueueConfig) -> None:
    assert QueueConfig.from_value(config.to_dict()) == config
    assert parse_queues([config.to_dict()])[config.name] == config


def test_cost_limit_is_the_least_cost_capacity() -> None:
    config = QueueConfig("q", rate_limit=["500/m", {"limit": 200, "period": 60, "per": "cost"}],
                         per_key_rate_limit={"limit": 50, "period": 1, "algorithm": "gcra",
                                             "burst": 40, "per": "cost"})
    assert config.cost_limit() == (40, config.per_key_rate_limits[0])
    assert QueueConfig("q", rate_limit="5/s").cost_limit() == (math.inf, None)


def q(**fields: Any) -> dict[str, Any]:
    return {"name": "q", **fields}


BAD = [
    pytest.param(q(rate_limit=[]), "rate_limit", "1 to 8", id="empty-list"),
    pytest.param(q(rate_limit=["1/s"] * 2), "rate_limit[1]", "same limit", id="duplicate"),
    pytest.param(q(rate_limit=[f"{i}/s" for i in range(1, MAX_RATE_LIMITS + 2)]), "rate_limit",
                 "got 9", id="too-many"),
    pytest.param(q(rate_limit=["1/s", "fast"]), "rate_limit[1]", "'fast'", id="garbage-entry"),
    pytest.param(q(rate_limit=["1/s", {"limit": 0, "period": 1}]), "rate_limit[1].limit",
                 "got 0", id="entry-limit"),
    pytest.param(q(rate_limit=["1/s", {"limit": 1}]), "rate_limit[1].period", "is required",
                 id="entry-period-missing"),
    pytest.param(q(rate_limit=[{"limit": 1, "period": 1, "per": "token"}]), "rate_limit[0].per",
                 "'token'", id="per-unknown"),
    pytest.param(q(rate_limit={"limit": 1, "period": 1, "per": None}), "rate_limit.per", "None",
                 id="per-none"),
    pytest.param(q(rate_limit={"limit": 1, "period": 1, "adaptive": "yes"}),
                 "rate_limit.adaptive", "'yes'", id="adaptive-not-bool"),
    pytest.param(q(rate_limit={"limit": 1, "period": 1, "adaptive": 1}),
                 "rate_limit.adaptive", "got 1", id="adaptive-int"),
    pytest.param(q(rate_limit={"limit": 1, "period": 1, "cost": 3}), "rate_limit.cost",
                 "unknown key", id="unknown-key"),
    pytest.param(q(rate_limit={"1/s"}), "rate_limit", "got {'1/s'}", id="a-set"),
    pytest.param(q(rate_limit=5), "rate_limit", "got 5", id="a-number"),
    pytest.param(q(per_key_rate_limit="20/w"), "per_key_rate_limit", "'20/w'",
                 id="key-garbage"),
    pytest.param(q(per_key_rate_limit={"limit": -1, "period": 1}), "per_key_rate_limit.limit",
                 "got -1", id="key-limit"),
    pytest.param(q(per_key_rate_limit=["1/s", {"limit": 1, "period": 0}]),
                 "per_key_rate_limit[1].period", "got 0", id="key-entry-period"),
    pytest.param(q(per_key_rate_limit={"limit": 1, "period": 1, "adaptive": True}),
                 "per_key_rate_limit.adaptive", "the queue's own", id="key-adaptive"),
    pytest.param(q(per_key_rate_limit=["2/s", {"limit": 1, "period": 1, "adaptive": True}]),
                 "per_key_rate_limit[1].adaptive", "the queue's own", id="key-entry-adaptive"),
    pytest.param(q(per_key_rate_limit=[]), "per_key_rate_limit", "1 to 8", id="key-empty"),
    pytest.param(q(rate_limit=[{"limit": 2, "period": 1, "burst": 2}]), "rate_limit[0].burst",
                 "only for algorithm 'gcra'", id="entry-burst"),
]


@pytest.mark.parametrize(("entry", "field", "detail"), BAD)
def test_every_bad_value_names_the_queue_and_the_field(entry: dict[str, Any], field: str,
                                                       detail: str) -> None:
    with pytest.raises(FlowControlConfigError) as info:
        QueueConfig.from_value(entry)
    assert (info.value.queue, info.value.field) == ("q", field)
    assert detail in str(info.value)
    assert str(info.value).startswith(f"flow queue 'q': field {field!r}: ")


def test_a_bare_rate_limit_names_its_field_without_a_queue() -> None:
    with pytest.raises(FlowControlConfigError) as info:
        RateLimit(1, 1, per="tokens")
    assert (info.value.queue, info.value.field) == (None, "rate_limit.per")
