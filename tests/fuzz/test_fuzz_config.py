"""Config parsing under hypothesis: every QueueConfig and RateLimit field, from strings,
numbers, dicts and junk. Each input gets either a valid, round-tripping config or a
``FlowControlConfigError`` that names the field; nothing else ever escapes."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_flowcontrol.config import (
    MAX_CONCURRENCY,
    MAX_HOLD_LIMIT,
    QueueConfig,
    RateLimit,
    parse_duration,
    parse_queues,
)
from celery_flowcontrol.errors import FlowControlConfigError

FIELDS = ("name", "concurrency", "rate_limit", "retry", "fairness", "order",
          "per_key_concurrency", "release", "max_hold")
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Values a YAML/JSON/env-var config could hand us, plus some a careless caller could.
junk = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12), st.floats(allow_nan=True),
    st.text(max_size=40), st.binary(max_size=10),
    st.sampled_from(["", " ", "0", "-1", "1e309", "nan", "inf", "10/s", "5/0s", "1/-1s", "100/m",
                     "90s", "45m", "2h", "1d", "250ms", "1.5h", "fifo", "lifo", "key", "manual",
                     "on_result", "sliding", "gcra", "fixed", "api", "API", "a{b}", "a:b",
                     "a\nb", "a\x00b", "é", "x" * 65, "x" * 10_000]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.sampled_from(["limit", "period", "algorithm", "burst", "bogus"]),
                    st.one_of(st.integers(-5, 10**6), st.text(max_size=8), st.none()), max_size=5),
)
durations = st.one_of(
    st.floats(min_value=0.001, max_value=1e6),
    st.builds(lambda n, u: f"{n}{u}", st.integers(1, 999), st.sampled_from(["ms", "s", "m", "h", "d", ""])),
)
rates = st.one_of(
    st.builds(lambda n, p, u: f"{n}/{p}{u}", st.integers(1, 10**6),
              st.sampled_from(["", "2", "90", "0.5"]), st.sampled_from(["ms", "s", "m", "h", "d"])),
    st.fixed_dictionaries({"limit": st.integers(1, 10**6), "period": durations},
                          optional={"algorithm": st.sampled_from(["fixed", "sliding", "gcra"]),
                                    "burst": st.integers(1, 1000)}),
)


def check_error(exc: FlowControlConfigError, field: str | None = None) -> None:
    """A config error is a ValueError that names its field (and the queue, when known)."""
    assert isinstance(exc, ValueError)
    assert exc.field, f"no field named in {exc!r}"
    if field is not None:
        assert exc.field.startswith(field) or field in str(exc), (field, exc.field, str(exc))
    text = str(exc)
    assert exc.field in text, f"message {text!r} does not name field {exc.field!r}"
    if exc.queue:
        # Shown as repr (a control character is escaped, not printed raw).
        assert exc.queue in text or repr(exc.queue)[1:-1] in text
    assert "\n" not in text, f"an error message is one line: {text!r}"


@FUZZ
@given(field=st.sampled_from(FIELDS[1:]), value=junk)
def test_any_value_of_any_field_is_valid_or_a_named_error(field: str, value: Any) -> None:
    """One field set to anything, the others defaulted (manual release needs a max_hold)."""
    kwargs: dict[str, Any] = {"name": "api", field: value}
    if field == "release" and value == "manual":
        kwargs["max_hold"] = 60
    try:
        config = QueueConfig.from_value(kwargs)
    except FlowControlConfigError as exc:
        check_error(exc, field)
        assert exc.queue == "api"
        return
    assert QueueConfig.from_value(config.to_dict()) == config, "to_dict must round-trip"
    if config.concurrency is not None:
        assert 1 <= config.concurrency <= MAX_CONCURRENCY
    if config.max_hold is not None:
        assert 0 < config.max_hold <= MAX_HOLD_LIMIT
    assert math.isfinite(config.retry) and config.retry > 0


@FUZZ
@given(name=st.one_of(st.text(max_size=80), junk))
def test_queue_names_outside_the_pattern_are_refused(name: Any) -> None:
    """Braces, colons, newlines, NUL, upper case, 65+ chars: never a queue name (they would
    break the ``fc:{name}:part`` key layout and its hash tag)."""
    try:
        config = QueueConfig.from_value({"name": name, "concurrency": 1})
    except FlowControlConfigError as exc:
        check_error(exc, "name")
        return
    assert isinstance(config.name, str) and 1 <= len(config.name) <= 64
    assert not set(config.name) - set("abcdefghijklmnopqrstuvwxyz0123456789._-")


@FUZZ
@given(value=st.one_of(rates, junk))
def test_rate_limits_parse_or_name_the_field(value: Any) -> None:
    try:
        rate = RateLimit.parse(value, queue="api")
    except FlowControlConfigError as exc:
        check_error(exc)
        return
    assert rate.limit >= 1 and math.isfinite(rate.period) and rate.period > 0
    assert rate.algorithm in ("fixed", "sliding", "gcra") and rate.burst >= 1
    assert RateLimit.parse(rate.to_dict()) == rate


@FUZZ
@given(value=st.one_of(durations, junk))
def test_durations_parse_to_positive_finite_seconds_or_name_the_field(value: Any) -> None:
    try:
        seconds = parse_duration(value, queue="api", field="retry")
    except FlowControlConfigError as exc:
        check_error(exc, "retry")
        return
    assert math.isfinite(seconds) and seconds > 0


@FUZZ
@given(values=st.one_of(junk, st.lists(st.one_of(junk, st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "a"]), "concurrency": st.integers(-1, 3)})), max_size=4)))
def test_queue_lists_parse_or_name_the_field(values: Any) -> None:
    """``flowcontrol_queues`` as a settings file could hold it (duplicates included)."""
    try:
        queues = parse_queues(values)
    except FlowControlConfigError as exc:
        check_error(exc)
        return
    assert all(isinstance(c, QueueConfig) and c.name == n for n, c in queues.items())
