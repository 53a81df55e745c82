"""Quotas on Redis: what one decision costs with several limits and per-key windows.

The first figure of issue #19's ``benchmarks/quota.py``, on one Redis server, in one run:

* the median cost of one admit+release pair on a queue with one rate limit, beside the same
  on a queue with three limits (calls per second and per day, tokens per minute, the token
  one charged each call's cost) and a per-key window, every call a fresh fairness key
  (target: at most 1.3x). Both queues are wide open (no denial), so the figure is what the
  limits cost a decision, not a wait. Measured in turns of 20 calls, the two queues round
  robin in one loop, so a busy spell on a shared machine hits both alike. The one-limit queue
  takes admit.lua's fast path; the same limit decided by the full rules is printed beside
  it, to tell what the fast path saves from what the limits cost.

The fake-API arms of the issue (Celery's own rate_limit with autoretry; limits known, with
settled costs; limits unknown, adaptive with FlowBackoff) are not here yet: they need the
worker to pass a message's flow_cost to admission (docs/quotas.md, "Not there yet")::

    python -m benchmarks.quota            # about 20 s
    python -m benchmarks.quota --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

import redis

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    r = run(args.url, 50 if args.quick else 200)
    ratio = r["many"] / r["one"]
    print(f"{'decision':<52} {'us/pair':>9}")
    print(f"{'one rate limit (fast path)':<52} {r['one'] * 1e6:>9.1f}")
    print(f"{'one rate limit, full rules (adaptive)':<52} {r['onefull'] * 1e6:>9.1f}")
    print(f"{'3 limits (one per cost) + a per-key window':<52} {r['many'] * 1e6:>9.1f}")
    print(f"ratio {ratio:.2f} (target <= 1.30): {'met' if ratio <= 1.3 else 'MISSED'}; "
          f"beside the full rules' one limit {r['many'] / r['onefull']:.2f}")


if __name__ == "__main__":
    main()
