"""Admission through RedisBackend beside its baselines, on one Redis server, in one run.

Figures (one client, one connection at a time, Redis ``TIME`` as the clock):

* admit+release pairs/s vs a trivial ``EVALSHA "return 1"`` round trip (target >= 0.5:
  a pair is two round trips, so 0.5 means the scripts cost about nothing beside the trip);
* the same pairs/s vs dramatiq's ``ConcurrentRateLimiter`` acquire+release (target >= 3);
* sliding-window admissions/s vs ``limits``' ``MovingWindowRateLimiter.hit`` (target >= 1);
* the cost of a denied admission on a full queue, and of an admit+release on a queue whose
  waiters are all capped by their key, with 10, 1,000 and 100,000 waiters (target: the
  100,000 cost at most 2x the 10 cost). Costs are medians of single calls.

Throughputs alternate ours and the baseline over a few rounds and keep each side's best, so
a noisy neighbour on a small machine hurts both alike::

    python -m benchmarks.admission            # about a minute
    python -m benchmarks.admission --quick    # about half that
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable

import redis

from celery_flowcontrol.admission import Admitted, Ticket
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig, RateLimit

DEFAULT_URL = os.environ.get("FLOWCONTROL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
WAITERS = (10, 1_000, 100_000)
Row = tuple[str, float, float, float, str, bool]


def per_second(op: Callable[[], object], seconds: float) -> float:
    """How many times per second *op* runs, over about *seconds*."""
    n, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(50):
            op()
        n += 50
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


def best_of(rounds: int, seconds: float, ours: Callable[[], object],
            theirs: Callable[[], object]) -> tuple[float, float]:
    """Alternate the two measurements; each side's best rate."""
    a, b = 0.0, 0.0
    for _ in range(rounds):
        a = max(a, per_second(ours, seconds))
        b = max(b, per_second(theirs, seconds))
    return a, b


def median_us(op: Callable[[int], object], calls: int) -> float:
    """Median wall time of one ``op(i)`` call, in microseconds."""
    times = []
    for i in range(calls):
        t = time.perf_counter()
        op(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


class Bench:
    """One Redis server, one key prefix; everything made here is removed by :meth:`close`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.token = f"fcbench-{uuid.uuid4().hex[:8]}"
        self.client = redis.Redis.from_url(url)
        self.backend = RedisBackend(self.client, key_prefix=self.token)

    def close(self) -> None:
        self.backend.close()
        for key in list(self.client.scan_iter(match=f"*{self.token}*", count=1000)):
            self.client.delete(key)
        self.client.close()

    # -- figures ------------------------------------------------------------------------------
    def pairs(self, queue: str, key: str = "") -> Callable[[], object]:
        counter = iter(range(10**12))

        def pair() -> None:
            d = self.backend.try_admit(Ticket(queue, f"t{next(counter)}", "bench", 0, key))
            assert isinstance(d, Admitted), d
            self.backend.release(d.slot.slot_id)
        return pair

    def vs_trivial(self, rounds: int, seconds: float) -> Row:
        self.backend.register(QueueConfig("pairs", concurrency=100))
        sha = self.client.script_load("return 1")
        ours, base = best_of(rounds, seconds, self.pairs("pairs"),
                             lambda: self.client.evalsha(sha, 0))
        return ("admit+release pairs/s vs EVALSHA 'return 1'/s", ours, base, ours / base,
                ">= 0.5", ours / base >= 0.5)

    def vs_dramatiq(self, rounds: int, seconds: float) -> Row:
        from dramatiq.rate_limits import ConcurrentRateLimiter
        from dramatiq.rate_limits.backends import RedisBackend as DramatiqRedis

        mutex = ConcurrentRateLimiter(DramatiqRedis(client=self.client),
                                      f"{self.token}-dramatiq", limit=100)

        def acquire_release() -> None:
            with mutex.acquire(raise_on_failure=True):
                pass
        ours, base = best_of(rounds, seconds, self.pairs("pairs"), acquire_release)
        return ("admit+release pairs/s vs dramatiq ConcurrentRateLimiter", ours, base,
                ours / base, ">= 3", ours / base >= 3)

    def vs_limits(self, rounds: int, seconds: float) -> Row:
        from limits import RateLimitItemPerMinute
        from limits.storage import RedisStorage
        from limits.strategies import MovingWindowRateLimiter

        limiter = MovingWindowRateLimiter(RedisStorage(self.url))
        item = RateLimitItemPerMinute(1_000_000)
        self.backend.register(QueueConfig("sliding",
                                          rate_limit=RateLimit(1_000_000, 60, "sliding")))
        counter = iter(range(10**12))

        def admit() -> None:
            d = self.backend.try_admit(Ticket("sliding", f"s{next(counter)}", "bench"))
            assert d.admitted, d
        ours, base = best_of(rounds, seconds, admit, lambda: limiter.hit(item, self.token))
        return ("sliding-window admissions/s vs limits MovingWindow.hit", ours, base,
                ours / base, ">= 1.0", ours / base >= 1.0)

    def fill(self, queue: str, n: int, key: str) -> None:
        """*n* waiters on *queue*, a pipeline at a time (the backend's own script)."""
        have = self.backend.stats(queue).waiting
        for start in range(have, n, 2000):
            tickets = [Ticket(queue, f"w{i}", "bench", 0, key)
                       for i in range(start, min(n, start + 2000))]
            for d in self.backend._admit_pipelined(tickets):
                assert not d.admitted, d
        assert self.backend.stats(queue).waiting == n

    def waiter_costs(self, calls: int) -> list[Row]:
        """Denied admissions on a full queue; admit+release past a capped key's backlog."""
        b = self.backend
        b.register(QueueConfig("full", concurrency=1))
        assert b.try_admit(Ticket("full", "holder", "bench")).admitted
        b.register(QueueConfig("capped", concurrency=100, per_key_concurrency=1))
        assert b.try_admit(Ticket("capped", "holder", "bench", 0, "busy")).admitted
        pair = self.pairs("capped", key="free")

        def deny(i: int) -> None:
            d = b.try_admit(Ticket("full", f"new{i}", "bench"))
            assert not d.admitted, d
            b.withdraw("full", f"new{i}")  # keep the line at n (inside the timing: see below)

        deny_cost, pair_cost = {}, {}
        for n in WAITERS:
            self.fill("full", n, "")
            self.fill("capped", n, "busy")
            # The withdraw is timed with the denial; its own cost is the same at any n.
            deny_cost[n] = median_us(deny, calls)
            pair_cost[n] = median_us(lambda i: pair(), calls)
        rows: list[Row] = []
        for label, cost in (("denied admission + withdraw, full queue", deny_cost),
                            ("admit+release past a capped key's waiters", pair_cost)):
            for n in WAITERS[1:]:
                ratio = cost[n] / cost[WAITERS[0]]
                target = "<= 2.0" if n == WAITERS[-1] else ""
                rows.append((f"{label}: us at {n:,} vs {WAITERS[0]} waiters", cost[n],
                             cost[WAITERS[0]], ratio, target, ratio <= 2.0 or not target))
        return rows


def format_table(rows: list[Row]) -> str:
    width = max(len(r[0]) for r in rows)
    lines = [f"{'figure':<{width}}  {'value':>10}  {'baseline':>10}  {'ratio':>6}  target",
             "-" * (width + 45)]
    for figure, value, base, ratio, target, ok in rows:
        mark = "" if not target else ("  ok" if ok else "  MISSED")
        lines.append(f"{figure:<{width}}  {value:>10,.1f}  {base:>10,.1f}  {ratio:>6.2f}  "
                     f"{target}{mark}")
    return "\n".join(lines)


def main(quick: bool = False, url: str = DEFAULT_URL) -> bool:
    """Run every figure and print the table; ``False`` if a target was missed."""
    rounds, seconds, calls = (3, 1.0, 1500) if quick else (3, 2.5, 4000)
    started = time.perf_counter()
    bench = Bench(url)
    try:
        rows = [bench.vs_trivial(rounds, seconds), bench.vs_dramatiq(rounds, seconds),
                bench.vs_limits(rounds, seconds), *bench.waiter_costs(calls)]
    finally:
        bench.close()
    print(f"RedisBackend admission on {url} ({'quick' if quick else 'full'} profile, "
          f"{time.perf_counter() - started:.0f} s)")
    print(format_table(rows))
    return all(ok for *_, ok in rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter measurements")
    parser.add_argument("--redis-url", default=DEFAULT_URL)
    args = parser.parse_args()
    raise SystemExit(0 if main(quick=args.quick, url=args.redis_url) else 1)
