"""benchmarks/quota.py's judge: the figures read from the fake API's log (pure arithmetic).

What each figure means is what the targets of benchmarks/quota.py are checked on, so it is pinned
here: windows counted from the first call to the heavy backlog's last accepted one, "late"
from the fourth window on, a light call that never got through counted as waiting until
the arm stopped, and the fake API's 429 with the Retry-After after which the call fits.
"""

from __future__ import annotations

import pytest

from benchmarks.quota_api import Call, FakeAPI, Quota, figures

Q = Quota(window=10.0, requests=3, tokens=1000)


def call(at: float, tenant: str = "heavy", status: int = 200, tokens: int = 100,
         task: str = "", published: float = 0.0) -> Call:
    return Call(at, tenant, task or f"t{at}", published, status, tokens)


def test_windows_run_while_the_heavy_backlog_lasts_and_late_is_from_the_fourth() -> None:
    calls = [call(0.0, tokens=900), call(5.0, status=429), call(12.0, tokens=500),
             call(25.0, tokens=1000), call(31.0, status=429), call(35.0, tokens=800),
             call(41.0, tokens=600), call(44.0, "light", tokens=100, task="l1", published=43.0),
             call(3.5, "light", tokens=50, task="l0", published=3.0)]
    f = figures(calls, Q, [("l0", 3.0), ("l1", 43.0), ("l2", 44.5)], stopped=50.0)
    assert f.windows == [0.95, 0.5, 1.0, 0.8]  # [0,10) [10,20) [20,30) [30,40); 41 ends it
    assert f.use == pytest.approx(0.8125)
    assert f.use_late == pytest.approx(0.8)  # the fourth window alone
    assert (f.calls, f.rejected) == (9, 2)
    assert (f.calls_late, f.rejected_late) == (4, 1)
    assert f.share_late == 0.25
    # l0 waited 0.5 s, l1 1 s; l2 never got through: it waited until the arm stopped, 5.5 s.
    assert (f.light_p50, f.light_p95) == (1.0, 5.5)


def test_the_fake_api_refuses_over_either_limit_with_the_retry_after_of_the_call() -> None:
    api = FakeAPI(Quota(window=10.0, requests=2, tokens=1000, estimate=(100, 100)), seed=1)
    try:
        first, _ = api.decide("heavy", 400, "a", 0.0)
        assert 200 <= first <= 600, "the true count is 0.5x to 1.5x the estimate"
        api.decide("heavy", 10, "b", 0.0)
        tokens, retry = api.decide("heavy", 10, "c", 0.0)  # a third request in the window
        assert tokens == 0 and 9.9 < retry <= 10.0
        assert [c.status for c in api.log()] == [200, 200, 429]
    finally:
        api.server_close()
