"""Quotas shaped like real APIs: a decision's cost, and three arms against a fake LLM API.

The quota figures, each beside its baseline from the same run:

* the median cost of one admit+release pair on a queue with one rate limit, beside the same
  on a queue with three limits (calls per second and per day, tokens per minute, the token
  one charged each call's cost) and a per-key window, every call a fresh fairness key
  (target: at most 1.3x). Both queues are wide open (no denial), so the figure is what the
  limits cost a decision, not a wait. Measured in turns of 20 calls, the two queues round
  robin in one loop, so a busy spell on a shared machine hits both alike. The one-limit queue
  takes admit.lua's fast path; the same limit decided by the full rules is printed beside
  it, to tell what the fast path saves from what the limits cost.

* the fake-API arms (:mod:`benchmarks.quota_api`): a loopback API enforcing sliding request
  and token limits per window (10 s in the quick profile, a minute in the full one), a call's
  true token count 0.5x to 1.5x its estimate and known only from the reply, a 429 with
  Retry-After when over; two worker nodes (prefork, ``-c 4``), a heavy tenant's backlog sent at
  once and a light tenant's call every few seconds while it lasts. Arms:

  1. Celery's own ``rate_limit``, the calls the token limit allows at the mean estimate split
     across the two workers, with ``autoretry_for`` the 429 (what users have today);
  2. ours, limits known: the request and token limits (sliding, their windows a hair longer
     than the API's: a call reaches it a moment after its admission), the estimate charged at
     publish (``flow_cost``), ``settle_cost`` with the true count, each tenant at most 0.9 of
     the requests and the tokens (``per_key_rate_limit``), ``fairness="key"``; no cap (the API
     has none); the light tenant's wait beside the same run with no heavy tenant;
  3. ours, limits unknown: ``adaptive=True`` ceilings at 3x the API's figures, ``FlowBackoff``
     on a 429.

  Targets: arm 2: no 429, tokens accepted >= 0.9 of the limit per window while the backlog
  lasts, the light tenant's p95 wait <= 1.2x its wait alone; arm 3: from the fourth window on,
  429s <= 1% of calls and tokens >= 0.8 of the limit. Arm 1's figures beside them::

    python -m benchmarks.quota            # about 45 min (minute windows)
    python -m benchmarks.quota --quick    # about 9 min (10 s windows)
    python -m benchmarks.quota --decision # the decision cost alone, about 20 s
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from typing import Any

import redis

from benchmarks._fleet import Row, table
from benchmarks.quota_api import Quota, run_arm
from celery_flowcontrol.admission import Ticket
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig

DEFAULT_URL = os.environ.get("FLOWCONTROL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
ONE = QueueConfig("one", concurrency=10_000, rate_limit="1000000/s")
#: The same one limit, adaptive: decided by the full rules (admit.lua's fast path takes only
#: queues with at most one per-call, non-adaptive limit and no per-key window).
ONE_FULL = QueueConfig("onefull", concurrency=10_000,
                       rate_limit={"limit": 1_000_000, "period": 1, "adaptive": True})
MANY = QueueConfig("many", concurrency=10_000,
                   rate_limit=["1000000/s", "100000000/d",
                               {"limit": 10**11, "period": "1m", "per": "cost"}],
                   per_key_rate_limit="1000/m")


def pair_cost(b: RedisBackend, queue: str, n: int, cost: float) -> float:
    """Seconds one admit+release pair takes, for *n* pairs of fresh tasks and keys."""
    start = time.perf_counter()
    for _ in range(n):
        tid = uuid.uuid4().hex
        d = b.try_admit(Ticket(queue, tid, "bench", fairness_key=tid[:12], cost=cost))
        assert d.admitted, d
        b.release(d.slot.slot_id)
    return (time.perf_counter() - start) / n


def run(url: str, turns: int) -> dict[str, float]:
    """The median cost of a pair on each queue."""
    client = redis.Redis.from_url(url)
    prefix = f"fcq-{uuid.uuid4().hex[:8]}"
    b = RedisBackend(client, key_prefix=prefix)
    try:
        for config in (ONE, ONE_FULL, MANY):
            b.register(config)
        costs: dict[str, list[float]] = {"one": [], "onefull": [], "many": []}
        for _ in range(turns + 10):  # the first 10 turns warm up
            for name in costs:
                costs[name].append(pair_cost(b, name, 20, 1200 if name == "many" else 1))
        return {name: statistics.median(c[10:]) for name, c in costs.items()}
    finally:
        b.close()
        keys = list(client.scan_iter(match=f"{prefix}:*", count=5000))
        for i in range(0, len(keys), 1000):
            client.delete(*keys[i:i + 1000])
        client.close()


#: Arm 2's margin, its windows this much longer than the API's (a call reaches the API a
#: little after its admission, so its entry there leaves later), and each tenant's share of
#: the tokens (the rest is room the light tenant finds at once).
LONGER, TENANT_SHARE = 1.02, 0.9


def known_queue(q: Quota) -> dict[str, Any]:
    """Arm 2's flow queue: the API's limits, known."""
    period = q.window * LONGER
    return {"name": "llm", "fairness": "key",
            "rate_limit": [{"limit": q.requests, "period": period, "algorithm": "sliding"},
                           {"limit": q.tokens, "period": period,
                            "algorithm": "sliding", "per": "cost"}],
            "per_key_rate_limit": [
                {"limit": int(q.requests * TENANT_SHARE), "period": period, "algorithm": "sliding"},
                {"limit": int(q.tokens * TENANT_SHARE), "period": period, "algorithm": "sliding",
                 "per": "cost"}]}


def adaptive_queue(q: Quota) -> dict[str, Any]:
    """Arm 3's flow queue: ceilings at 3x the API's figures, learnt from its 429s."""
    return {"name": "llm", "fairness": "key",
            "rate_limit": [{"limit": 3 * q.requests, "period": q.window, "algorithm": "sliding",
                            "adaptive": True},
                           {"limit": 3 * q.tokens, "period": q.window, "algorithm": "sliding",
                            "per": "cost", "adaptive": True}]}


def celery_rate(q: Quota) -> str:
    """Arm 1's per-worker ``rate_limit``: the calls the token limit allows at the mean
    estimate (or the request limit, if lower), split across the two nodes, per second."""
    calls = min(q.requests, q.tokens / (sum(q.estimate) / 2))
    return f"{calls / q.window / 2:g}/s"


def arms(q: Quota) -> bool:
    """The three arms and the light tenant alone; print the table; True if targets are met."""
    plain = run_arm("celery", None, q, celery_rate=celery_rate(q))
    known = run_arm("known", known_queue(q), q)
    # As many light calls alone as beside the heavy tenant: the same rank makes each p95.
    alone = run_arm("known", known_queue(q), q, heavy=False, light_calls=len(known.light_waits))
    adaptive = run_arm("adaptive", adaptive_queue(q), q)
    light = known.light_p95 / alone.light_p95
    rows = [
        Row("arm 2: 429s", known.rejected, plain.rejected, "", None, "0", known.rejected == 0),
        Row("arm 2: tokens per window / limit", known.use, plain.use, "", None, ">= 0.9",
            known.use >= 0.9),
        Row("arm 2: light tenant p95 wait (base: alone)", known.light_p95 * 1e3,
            alone.light_p95 * 1e3, "ms", light, "<= 1.2 x alone", light <= 1.2),
        Row("arm 3: 429s / calls from window 4", adaptive.share_late * 100,
            plain.share_late * 100, "%", None, "<= 1 %", adaptive.share_late <= 0.01),
        Row("arm 3: tokens per window / limit from window 4", adaptive.use_late, plain.use_late,
            "", None, ">= 0.8", adaptive.use_late >= 0.8),
    ]
    print(table(f"quota arms: {q.requests} requests and {q.tokens:,} tokens per {q.window:g} s, "
                f"{q.heavy} heavy calls (baseline: arm 1, Celery rate_limit {celery_rate(q)} "
                "per worker + autoretry)", rows))
    for name, f in (("arm 1 celery", plain), ("arm 2 known", known), ("arm 2 light alone", alone),
                    ("arm 3 adaptive", adaptive)):
        print(f"{name:18} calls {f.calls:5}  429s {f.rejected:4} ({f.share:.1%}; from window 4 "
              f"{f.rejected_late} of {f.calls_late}, {f.share_late:.2%})  "
              f"use {f.use:.2f} (from window 4: {f.use_late:.2f})  light wait p50 "
              f"{f.light_p50:.3f} s p95 {f.light_p95:.3f} s  backlog {f.seconds:.0f} s  "
              f"parks {f.parked} admissions {f.admitted}")
        print(f"{'':18} windows " + " ".join(f"{w:.2f}" for w in f.windows))
    return all(r.ok for r in rows)


def decision(turns: int) -> bool:
    """The decision cost; print it; True if the target is met."""
    r = run(DEFAULT_URL, turns)
    ratio = r["many"] / r["one"]
    rows = [Row("3 limits (one per cost) + a per-key window", r["many"] * 1e6, r["one"] * 1e6, "us",
                ratio, "<= 1.3 x one limit", ratio <= 1.3),
            Row("one limit, decided by the full rules", r["onefull"] * 1e6, r["one"] * 1e6, "us",
                r["onefull"] / r["one"], "-", True)]
    print(table("quota decision: one admit+release pair on Redis, median of turns of 20 (baseline: "
                "one rate limit, admit.lua's fast path)", rows))
    return ratio <= 1.3


QUICK = Quota()
FULL = Quota(window=60.0, requests=900, tokens=240_000, heavy=6000, light_every=5.0)


def main(quick: bool = False, only_decision: bool = False) -> bool:
    """Every figure (``--decision``: the decision cost alone)."""
    ok = decision(50 if quick else 200)
    if not only_decision:
        ok = arms(QUICK if quick else FULL) and ok
    return ok


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--decision", action="store_true")
    args = parser.parse_args()
    raise SystemExit(0 if main(args.quick, args.decision) else 1)
