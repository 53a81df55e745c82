"""Calls that collapse, the pure part: which calls share a key, when a burst runs, and which
inputs are refused (naming the task and the option), with an injected clock for the claims."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from celery_flowcontrol.collapse.claims import MemoryClaims
from celery_flowcontrol.collapse.keys import (
    MAX_KEY_BYTES,
    CollapseError,
    DebounceSpec,
    canonical,
    debounce_key,
    debounce_spec,
    unique_key,
    unique_ttl,
    wake_of,
)
from celery_flowcontrol.errors import FlowControlError


def test_the_same_arguments_in_any_keyword_order_make_one_key() -> None:
    a = unique_key("t", True, (1, "x"), {"b": 2, "a": {"z": 1, "y": [1, 2]}})
    b = unique_key("t", True, [1, "x"], {"a": {"y": (1, 2), "z": 1}, "b": 2})
    assert a == b == 't:[[1,"x"],{"a":{"y":[1,2],"z":1},"b":2}]'
    assert unique_key("t", True, (1,), {}) != unique_key("t", True, (2,), {})
    assert unique_key("t", True, (1,), {}) != unique_key("other", True, (1,), {})
    assert unique_key("t", None, (1,), {}) is None and unique_key("t", False, (1,), {}) is None


def test_a_key_callable_or_a_key_sent_by_name_replaces_the_arguments() -> None:
    assert unique_key("t", lambda a, k: f"order-{k['id']}", (), {"id": 7, "n": 1}) == "t:order-7"
    assert unique_key("t", "order-7", (), {}) == "t:order-7"
    assert debounce_key("t", None, (1,), {}) == "t"
    assert debounce_key("t", lambda a, k: str(a[0]), (1,), {}) == "t:1"


def test_a_long_key_is_stored_as_its_digest() -> None:
    key = unique_key("t", True, ("x" * 2000,), {})
    assert key is not None and key.startswith("sha256:") and len(key) < MAX_KEY_BYTES
    assert key == unique_key("t", True, ("x" * 2000,), {})


@pytest.mark.parametrize("value", [object(), b"bytes", {1: "int key"}, math.nan, math.inf,
                                   dt.datetime(2026, 1, 1), {1, 2}])
def test_an_argument_without_one_canonical_form_is_refused(value: object) -> None:
    with pytest.raises(CollapseError) as info:
        unique_key("app.sync", True, (value,), {})
    assert (info.value.task, info.value.option) == ("app.sync", "flow_unique")
    assert "app.sync" in str(info.value) and "flow_unique" in str(info.value)
    assert isinstance(info.value, FlowControlError)


def test_a_key_callable_that_raises_or_returns_a_non_string_is_refused() -> None:
    def boom(args: object, kwargs: object) -> str:
        raise KeyError("tenant")

    for spec, option in ((boom, "flow_unique"), (lambda a, k: 42, "flow_unique"),
                         (lambda a, k: "", "flow_unique")):
        with pytest.raises(CollapseError) as info:
            unique_key("app.sync", spec, (), {})
        assert (info.value.task, info.value.option) == ("app.sync", option)
    with pytest.raises(CollapseError) as info:
        debounce_key("app.sync", lambda a, k: None, (), {})
    assert (info.value.task, info.value.option) == ("app.sync", "debounce_key")
    with pytest.raises(CollapseError):
        unique_key("app.sync", 3.5, (), {})


@pytest.mark.parametrize("value", [0, -1, "0s", "-5s", "soon", math.nan, True])
def test_a_debounce_of_zero_or_below_is_refused(value: object) -> None:
    with pytest.raises(CollapseError) as info:
        debounce_spec("app.reindex", value)
    assert (info.value.task, info.value.option) == ("app.reindex", "flow_debounce")


def test_debounce_and_its_bound() -> None:
    assert debounce_spec("t", None) is None
    assert debounce_spec("t", "5s", "1m") == DebounceSpec(5.0, 60.0)
    with pytest.raises(CollapseError) as info:
        debounce_spec("t", "5s", "2s")
    assert info.value.option == "flow_debounce_max"
    spec = DebounceSpec(5.0, 12.0)
    assert wake_of(100.0, 100.0, spec) == 105.0  # trailing edge: after the last call
    assert wake_of(104.0, 100.0, spec) == 109.0
    assert wake_of(110.0, 100.0, spec) == 112.0  # never past first + max
    assert wake_of(1000.0, 100.0, DebounceSpec(5.0, None)) == 1005.0


def test_the_unique_ttl_defaults_to_max_hold_then_one_hour() -> None:
    assert unique_ttl("t", None, None) == 3600.0
    assert unique_ttl("t", None, 120.0) == 120.0
    assert unique_ttl("t", "10m", 120.0) == 600.0
    with pytest.raises(CollapseError) as info:
        unique_ttl("t", -1, None)
    assert info.value.option == "flow_unique_ttl"


def test_canonical_form_is_sorted_compact_json() -> None:
    assert canonical((), {"b": 1, "a": "é"}, task="t") == '[[],{"a":"é","b":1}]'


def test_memory_claims_hold_until_released_or_expired() -> None:
    now = [1000.0]
    claims = MemoryClaims(clock=lambda: now[0])
    assert claims.claim("unique", "k", "first", 10) == "first"
    assert claims.claim("unique", "k", "second", 10) == "first"
    assert claims.release("unique", "k", "second") is False  # only its holder frees a key
    assert claims.claim("unique", "k", "first", 10) == "first"  # its own again: TTL restarts
    now[0] += 9.5
    assert claims.holder("unique", "k") == "first"
    assert claims.extend("unique", "k", "first", 2) and not claims.extend("unique", "k", "x", 2)
    now[0] += 2.5
    assert claims.holder("unique", "k") is None  # expired: a crashed holder can't keep it
    assert claims.claim("unique", "k", "second", 10) == "second"
    assert [h.task_id for h in claims.held("unique")] == ["second"]
    assert claims.held("debounce") == []
    assert claims.release("unique", "k", "second") and claims.holder("unique", "k") is None
