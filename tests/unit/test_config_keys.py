"""Unequal tenants' config: ``keys=``, ``per_key_reserve``, ``per_key_max_waiting``,
``max_waiting`` and run-time key overrides; every bad input is a FlowControlConfigError naming
the queue, the key and the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from celery_flowcontrol import FlowControlError, FlowQueueFull
from celery_flowcontrol.admission import Refused
from celery_flowcontrol.config import KeyConfig, QueueConfig, RateLimit, parse_queues
from celery_flowcontrol.errors import FlowControlConfigError

BIG_KEY = "k" * 257
WIDE_KEY = "é" * 129  # 129 characters, 258 bytes in UTF-8


def key_q(key: str = "acme", cap: int | None = 10, **fields: Any) -> dict[str, Any]:
    """Queue 'q' of concurrency *cap* with *fields* for *key* in ``keys=``."""
    return {"name": "q", "concurrency": cap, "fairness": "key", "keys": {key: fields}}


REJECTIONS = [
    pytest.param(key_q(weight=0), "keys['acme'].weight", "0", id="weight-zero"),
    pytest.param(key_q(weight=-1.5), "keys['acme'].weight", "-1.5", id="weight-negative"),
    pytest.param(key_q(weight="5"), "keys['acme'].weight", "'5'", id="weight-str"),
    pytest.param(key_q(weight=True), "keys['acme'].weight", "True", id="weight-bool"),
    pytest.param(key_q(weight=float("nan")), "keys['acme'].weight", "nan", id="weight-nan"),
    pytest.param(key_q(weight=float("inf")), "keys['acme'].weight", "inf", id="weight-inf"),
    pytest.param(key_q(reserve=-1), "keys['acme'].reserve", "-1", id="reserve-negative"),
    pytest.param(key_q(reserve=11), "keys['acme'].reserve", "11", id="reserve-over-queue"),
    pytest.param(key_q(reserve=3, concurrency=2), "keys['acme'].reserve", "3",
                 id="reserve-over-own-concurrency"),
    pytest.param({**key_q(reserve=3), "per_key_concurrency": 2}, "keys['acme'].reserve", "3",
                 id="reserve-over-per-key-concurrency"),
    pytest.param(key_q(max_waiting=0), "keys['acme'].max_waiting", "0", id="key-max-waiting-zero"),
    pytest.param(key_q(concurrency=0), "keys['acme'].concurrency", "0", id="concurrency-zero"),
    pytest.param(key_q(concurrency=11), "keys['acme'].concurrency", "11",
                 id="concurrency-over-queue"),
    pytest.param(key_q(rate_limit="fast"), "keys['acme'].rate_limit", "'fast'", id="rate-bad"),
    pytest.param(key_q(rate_limit={"limit": 5, "period": 1, "adaptive": True}),
                 "keys['acme'].rate_limit.adaptive", "adaptive", id="rate-adaptive"),
    pytest.param(key_q(wieght=2), "keys['acme'].wieght", "'weight'", id="unknown-field"),
    pytest.param(key_q(key=BIG_KEY, weight=2), "keys", "257", id="key-over-256-bytes"),
    pytest.param(key_q(key=WIDE_KEY, weight=2), "keys", "258", id="key-over-256-utf8-bytes"),
    pytest.param({"name": "q", "keys": {7: {"weight": 2}}}, "keys", "7", id="key-not-str"),
    pytest.param({"name": "q", "keys": ["acme"]}, "keys", "['acme']", id="keys-not-a-dict"),
    pytest.param({"name": "q", "keys": {"acme": 5}}, "keys['acme']", "5", id="entry-not-a-dict"),
    pytest.param({"name": "q", "per_key_reserve": -1}, "per_key_reserve", "-1",
                 id="per-key-reserve-negative"),
    pytest.param({"name": "q", "concurrency": 4, "per_key_reserve": 5}, "per_key_reserve", "5",
                 id="per-key-reserve-over-concurrency"),
    pytest.param({"name": "q", "concurrency": 9, "per_key_concurrency": 2, "per_key_reserve": 3},
                 "per_key_reserve", "3", id="per-key-reserve-over-per-key-concurrency"),
    pytest.param({"name": "q", "per_key_max_waiting": 0}, "per_key_max_waiting", "0",
                 id="per-key-max-waiting-zero"),
    pytest.param({"name": "q", "max_waiting": 0}, "max_waiting", "0", id="max-waiting-zero"),
    pytest.param({"name": "q", "max_waiting": 2.5}, "max_waiting", "2.5", id="max-waiting-float"),
]


@pytest.mark.parametrize(("entry", "field", "given"), REJECTIONS)
def test_bad_key_settings_name_queue_key_and_field(entry: dict[str, Any], field: str,
                                                   given: str) -> None:
    with pytest.raises(FlowControlConfigError) as info:
        QueueConfig.from_value(entry)
    err = info.value
    assert (err.queue, err.field) == ("q", field)
    assert given in str(err) and "'q'" in str(err)


def test_keys_accept_dicts_and_key_configs_and_round_trip() -> None:
    config = QueueConfig(
        "reports", concurrency=20, fairness="key", per_key_concurrency=4,
        per_key_rate_limit="60/m", per_key_reserve=1, per_key_max_waiting=500,
        max_waiting=10_000,
        keys={"acme": {"weight": 5, "concurrency": 10, "rate_limit": "600/m", "reserve": 4},
              "free-tier-bot": KeyConfig(weight=0.2, concurrency=1)})
    acme = config.keys["acme"]
    assert acme == KeyConfig(weight=5.0, concurrency=10, rate_limit=RateLimit(600, 60),
                             reserve=4)
    assert config.key_config("free-tier-bot").weight == 0.2
    assert config.key_config("nobody") == KeyConfig()
    data = json.loads(json.dumps(config.to_dict()))
    assert QueueConfig.from_value(data) == config
    assert parse_queues([data])["reports"] == config
    assert hash(config) == hash(QueueConfig.from_value(data))


def test_reserve_may_rise_with_the_keys_own_concurrency() -> None:
    config = QueueConfig("q", concurrency=10, per_key_concurrency=2,
                         keys={"acme": {"concurrency": 6, "reserve": 6}})
    assert config.keys["acme"].reserve == 6


def test_key_override_is_checked_like_config_and_a_none_drops_a_field() -> None:
    config = QueueConfig("q", concurrency=10, per_key_concurrency=3,
                         keys={"acme": {"weight": 5}})
    override = config.key_override("acme", {}, {"concurrency": 8, "rate_limit": "6/s"})
    assert override == {"concurrency": 8, "rate_limit": RateLimit(6, 1)}
    assert config.key_settings("acme", override) == KeyConfig(
        weight=5.0, concurrency=8, rate_limit=RateLimit(6, 1))
    override = config.key_override("acme", override, {"concurrency": None, "weight": 2})
    assert override == {"rate_limit": RateLimit(6, 1), "weight": 2.0}
    assert config.key_settings("acme", override).concurrency is None
    with pytest.raises(FlowControlConfigError) as info:
        config.key_override("acme", override, {"reserve": 4})  # above per_key_concurrency 3
    assert (info.value.queue, info.value.field) == ("q", "keys['acme'].reserve")
    with pytest.raises(FlowControlConfigError) as info:
        config.key_override("acme", {}, {"weight": 0})
    assert info.value.field == "keys['acme'].weight"
    with pytest.raises(FlowControlConfigError) as info:
        config.key_override("acme", {}, {"colour": "red"})
    assert info.value.field == "keys['acme'].colour"
    with pytest.raises(FlowControlConfigError) as info:
        config.key_override(BIG_KEY, {}, {"weight": 2})
    assert info.value.field == "keys"


def test_flow_queue_full_names_queue_key_bound_and_field() -> None:
    err = Refused("q", "acme", 500, "keys['acme'].max_waiting").error()
    assert isinstance(err, FlowQueueFull) and isinstance(err, FlowControlError)
    assert (err.queue, err.key, err.bound, err.field) == (
        "q", "acme", 500, "keys['acme'].max_waiting")
    assert all(part in str(err) for part in ("'q'", "'acme'", "500", "keys['acme'].max_waiting"))
    again = FlowQueueFull(*err.args)  # as a result backend rebuilds it
    assert str(again) == str(err)
