"""The public tenant functions' own rules, before any backend: when a pause ends, and what
``set_key`` refuses up front."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery

from celery_flowcontrol import FlowControlConfigError, set_key
from celery_flowcontrol.tenants import pause_until

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("until", "at"), [
    (None, None),
    ("10m", NOW + 600),
    (timedelta(seconds=90), NOW + 90),
    (datetime.fromtimestamp(NOW + 5, timezone.utc), NOW + 5),
    (datetime.fromtimestamp(NOW + 5, timezone.utc).replace(tzinfo=None), NOW + 5),  # naive: UTC
    (NOW + 3600, NOW + 3600),
])
def test_a_pause_ends_at_a_duration_from_now_an_instant_or_never(until: object,
                                                                 at: float | None) -> None:
    assert pause_until(NOW, until) == at


@pytest.mark.parametrize("until", [600, "soon", -5, float("nan"), True, [1]])
def test_a_past_or_unreadable_end_is_refused_naming_until(until: object) -> None:
    with pytest.raises(FlowControlConfigError) as info:
        pause_until(NOW, until)
    assert info.value.field == "until"


def test_set_key_with_no_field_says_what_it_takes() -> None:
    app = Celery("t", broker="memory://", set_as_current=False)
    with pytest.raises(FlowControlConfigError) as info:
        set_key(app, "reports", "acme")
    assert info.value.queue == "reports" and "reset_key" in str(info.value)
    assert info.value.field == "keys['acme']"
