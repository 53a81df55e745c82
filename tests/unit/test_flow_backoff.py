"""FlowBackoff, the exception a task raises when the downstream pushes back."""

from __future__ import annotations

import math
import pickle

import pytest

from celery_flowcontrol import FlowBackoff, FlowControlError
from celery_flowcontrol.errors import FlowControlConfigError


def test_a_backoff_carries_its_seconds_and_scope() -> None:
    exc = FlowBackoff(30)
    assert (exc.retry_after, exc.scope) == (30.0, "queue")
    assert isinstance(exc, FlowControlError)
    assert str(exc) == "backoff: the flow queue admits nothing for 30 s"
    assert FlowBackoff("2.5", scope="key").retry_after == 2.5, "a Retry-After header's text"
    assert "fairness key" in str(FlowBackoff(1, "key"))


def test_it_survives_a_result_backend() -> None:
    """Celery rebuilds a remote exception from its args (or unpickles it)."""
    exc = FlowBackoff(12.5, "key")
    for again in (pickle.loads(pickle.dumps(exc)), FlowBackoff(*exc.args)):
        assert (again.retry_after, again.scope) == (12.5, "key")


@pytest.mark.parametrize(("args", "field"), [
    ((0,), "retry_after"), ((-1,), "retry_after"), ((math.nan,), "retry_after"),
    ((math.inf,), "retry_after"), ((86_401,), "retry_after"), (("soon",), "retry_after"),
    ((True,), "retry_after"), ((None,), "retry_after"), ((5, "tenant"), "scope"),
])
def test_a_bad_backoff_is_refused(args: tuple[object, ...], field: str) -> None:
    with pytest.raises(FlowControlConfigError) as info:
        FlowBackoff(*args)  # type: ignore[arg-type]
    assert info.value.field == field
