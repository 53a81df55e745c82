"""Admission through RedisBackend beside its baselines, on one Redis server, in one run.

Figures (one client, one connection at a time, Redis ``TIME`` as the clock):

* admit+release pairs/s vs a trivial ``EVALSHA "return 1"`` round trip (target >= 0.5:
  a pair is two round trips, so 0.5 means the scripts cost about nothing beside the trip);
* the same pairs/s vs dramatiq's ``ConcurrentRateLimiter`` acquire+release (target >= 3);
* sliding-window admissions/s vs ``limits``' ``MovingWindowRateLimiter.hit`` (target >= 1);
* the cost of a denied admission on a full queue, and of an admit+release on a queue whose
  waiters are all capped by their key, with 10, 1,000 and 100,000 waiters (target: the
  100,000 cost at most 2x the 10 cost). Costs are medians of single calls.

Throughputs are measured in turns of 20 calls, every operation round robin in one loop, and
the waiter costs call each queue in turn, so a busy spell on a small shared machine hits
every figure alike::

    python -m benchmarks.admission            # about 90 s
    python -m benchmarks.admission --quick    # about 70 s (most of it filling 2 x 100,000 waiters)
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


def interleaved(ops: dict[str, Callable[[], object]], seconds: float,
                slice_calls: int = 20) -> dict[str, float]:
    """Calls per second of each op, measured in turns of *slice_calls* calls each, round
    robin, for about *seconds* in all: a busy spell on the machine hits every op alike."""
    spent = dict.fromkeys(ops, 0.0)
    calls = dict.fromkeys(ops, 0)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for name, op in ops.items():
            start = time.perf_counter()
            for _ in range(slice_calls):
                op()
            spent[name] += time.perf_counter() - start
            calls[name] += slice_calls
    return {name: calls[name] / spent[name] for name in ops}


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

    def throughputs(self, seconds: float) -> list[Row]:
        """Ours and every baseline, interleaved in one loop."""
        from dramatiq.rate_limits import ConcurrentRateLimiter
        from dramatiq.rate_limits.backends import RedisBackend as DramatiqRedis
        from limits import RateLimitItemPerMinute
        from limits.storage import RedisStorage
        from limits.strategies import MovingWindowRateLimiter

        b = self.backend
        b.register(QueueConfig("pairs", concurrency=100))
        b.register(QueueConfig("sliding", rate_limit=RateLimit(1_000_000, 60, "sliding")))
        sha = self.client.script_load("return 1")
        mutex = ConcurrentRateLimiter(DramatiqRedis(client=self.client),
                                      f"{self.token}-dramatiq", limit=100)
        limiter = MovingWindowRateLimiter(RedisStorage(self.url))
        item = RateLimitItemPerMinute(1_000_000)
        counter = iter(range(10**12))

        def acquire_release() -> None:
            with mutex.acquire(raise_on_failure=True):
                pass

        def sliding_admit() -> None:
            assert b.try_admit(Ticket("sliding", f"s{next(counter)}", "bench")).admitted

        conn = self.client.connection_pool.get_connection()
        raw = [b"*3\r\n$7\r\nEVALSHA\r\n$40\r\n" + sha.encode() + b"\r\n$1\r\n0\r\n"]

        def raw_trivial() -> None:
            conn.send_packed_command(raw)
            conn.read_response()

        try:
            r = interleaved({"pairs": self.pairs("pairs"),
                             "trivial": lambda: self.client.evalsha(sha, 0),
                             "dramatiq": acquire_release, "sliding": sliding_admit,
                             "limits": lambda: limiter.hit(item, self.token),
                             "raw": raw_trivial}, seconds)
        finally:
            self.client.connection_pool.release(conn)
        return [
            ("admit+release pairs/s vs EVALSHA 'return 1'/s", r["pairs"], r["trivial"],
             r["pairs"] / r["trivial"], ">= 0.5", r["pairs"] / r["trivial"] >= 0.5),
            ("admit+release pairs/s vs dramatiq ConcurrentRateLimiter", r["pairs"],
             r["dramatiq"], r["pairs"] / r["dramatiq"], ">= 3", r["pairs"] / r["dramatiq"] >= 3),
            ("sliding-window admissions/s vs limits MovingWindow.hit", r["sliding"], r["limits"],
             r["sliding"] / r["limits"], ">= 1.0", r["sliding"] / r["limits"] >= 1.0),
            # Not a target: the trivial call sent the way the hot path sends (no redis-py
            # dispatch), to show how much of the first ratio is the lean client.
            ("(info) pairs/s vs 'return 1' on a raw connection", r["pairs"], r["raw"],
             r["pairs"] / r["raw"], "", True),
        ]

    def fill(self, queue: str, n: int, key: str) -> None:
        """*n* waiters on *queue*, a pipeline at a time (the backend's own script)."""
        have = self.backend.stats(queue).waiting
        for start in range(have, n, 2000):
            tickets = [Ticket(queue, f"w{i}", "bench", 0, key)
                       for i in range(start, min(n, start + 2000))]
            for d in self.backend.try_admit_many(tickets):
                assert not d.admitted, d
            # A long fill on a busy machine outlasts instance_ttl: the holders keep their slots.
            self.backend.heartbeat("bench")
        assert self.backend.stats(queue).waiting == n

    def waiter_costs(self, calls: int) -> list[Row]:
        """A denied admission on a full queue, and an admit+release on a queue whose waiters
        are all over their key's cap, at each line length; calls taken round robin."""
        b = self.backend
        for n in WAITERS:
            b.register(QueueConfig(f"full{n}", concurrency=1))
            assert b.try_admit(Ticket(f"full{n}", "holder", "bench")).admitted
            b.register(QueueConfig(f"capped{n}", concurrency=100, per_key_concurrency=1))
            assert b.try_admit(Ticket(f"capped{n}", "holder", "bench", 0, "busy")).admitted
            self.fill(f"full{n}", n, "")
            self.fill(f"capped{n}", n, "busy")
        times: dict[tuple[str, int], list[float]] = {(k, n): [] for k in ("deny", "pair")
                                                     for n in WAITERS}
        for i in range(calls):
            for n in WAITERS:
                t = time.perf_counter()
                d = b.try_admit(Ticket(f"full{n}", f"new{i}", "bench"))
                times["deny", n].append(time.perf_counter() - t)
                assert not d.admitted, d
                b.withdraw(f"full{n}", f"new{i}")  # untimed: keeps the line at n
                t = time.perf_counter()
                d = b.try_admit(Ticket(f"capped{n}", f"free{i}", "bench", 0, "free"))
                assert isinstance(d, Admitted), d
                b.release(d.slot.slot_id)
                times["pair", n].append(time.perf_counter() - t)
        cost = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        rows: list[Row] = []
        for kind, label in (("deny", "denied admission, full queue"),
                            ("pair", "admit+release past a capped key's waiters")):
            for n in WAITERS[1:]:
                ratio = cost[kind, n] / cost[kind, WAITERS[0]]
                target = "<= 2.0" if n == WAITERS[-1] else ""
                rows.append((f"{label}: us at {n:,} vs {WAITERS[0]} waiters", cost[kind, n],
                             cost[kind, WAITERS[0]], ratio, target, ratio <= 2.0 or not target))
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
    seconds, calls = (12.0, 1000) if quick else (20.0, 2000)
    started = time.perf_counter()
    bench = Bench(url)
    try:
        rows = [*bench.throughputs(seconds), *bench.waiter_costs(calls)]
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
