"""Unequal tenants: what weights and per-key settings cost a decision, and how fair the
weighted share is. One Redis server, one run, each figure beside its baseline:

* an admit+release pair on a ``fairness="key"`` queue whose keys have weights and settings of
  their own (``keys=``: weight, concurrency, reserve, max_waiting) beside the same pair on
  a plain ``fairness="key"`` queue (target: at most 1.15x); and a *grant cycle* (release a
  slot of a full queue: the next waiter by weight is granted; it confirms) on the two
  queues, every key backlogged (target: at most 1.15x);
* the same pair with 100,000 keys with settings of their own beside 10 (target: at most
  1.1x): a key's settings are read only for the keys a decision touches;
* the weighted share over a simulated flood: 20 keys of random weights (0.1 to 10), every
  one backlogged, one slot, 1,000 grants in turn, in the memory reference and in Redis
  (target: within one admission per key: for every two keys and every stretch, their
  admissions per unit of weight differ by at most one admission of each,
  :func:`~celery_flowcontrol.testing.contract_tenants.share_error` <= 1). The worst gap of a
  key's admissions from its weight's share of all of them is printed beside it.

Pairs and cycles are measured in turns of 20 calls, the two arms round robin in one loop, so
a busy spell on a shared machine hits both alike::

    python -m benchmarks.tenants            # about 60 s
    python -m benchmarks.tenants --quick    # about 30 s
"""

from __future__ import annotations

import argparse
import os
import random
import time
import uuid
from collections.abc import Callable

import redis

from benchmarks.admission import interleaved
from celery_flowcontrol.admission import AdmissionBackend, Admitted, MemoryBackend, Ticket
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.testing.contract_tenants import share_error

DEFAULT_URL = os.environ.get("FLOWCONTROL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def keyed(name: str, keys: int, capacity: int = 10_000) -> QueueConfig:
    """A fairness="key" queue; *keys* keys ("k0"...) with settings of their own: a weight
    (1 to 5), a concurrency, a reserve of 1 and a waiting bound."""
    own = {"concurrency": max(1, capacity // 2), "reserve": 1, "max_waiting": 100_000}
    return QueueConfig(name, concurrency=capacity, fairness="key",
                       keys={f"k{i}": dict(own, weight=1 + i % 5) for i in range(keys)})


def pairs(b: RedisBackend, queue: str, keys: int) -> Callable[[], None]:
    """An admit+release of the next key of *keys* (each call a fresh task)."""
    counter = iter(range(10**12))

    def pair() -> None:
        n = next(counter)
        d = b.try_admit(Ticket(queue, f"t{n}", "bench", 0, f"k{n % keys}"))
        assert isinstance(d, Admitted), d
        b.release(d.slot.slot_id)
    return pair


def cycles(b: RedisBackend, queue: str, keys: int, backlog: int) -> Callable[[], None]:
    """A grant cycle on a full queue of one slot: release it (the next waiter by weight is
    granted), confirm the grant, and a new waiter of that key joins the back (every key
    stays backlogged)."""
    held = [None]
    counter = iter(range(10**12))
    first = b.try_admit(Ticket(queue, "first", "bench", 0, "k0"))
    assert isinstance(first, Admitted)
    held[0] = first.slot.slot_id
    waiting = [Ticket(queue, f"w{next(counter)}", "bench", 0, f"k{i % keys}")
               for i in range(backlog)]
    b._admit_pipelined(waiting)

    def cycle() -> None:
        b.release(held[0])
        grant = b.pending_grants(queue)[0]
        d = b.try_admit(Ticket(queue, grant.task_id, "bench"))
        assert isinstance(d, Admitted), d
        held[0] = d.slot.slot_id
        b.try_admit(Ticket(queue, f"w{next(counter)}", "bench", 0, d.slot.fairness_key))
    return cycle


def flood(backend: AdmissionBackend, weights: dict[str, float], grants: int) -> list[str]:
    """The keys served, in order, over *grants* grants of one slot, every key backlogged."""
    total = sum(weights.values())
    backend.register(QueueConfig("flood", concurrency=1, fairness="key",
                                 keys={k: {"weight": w} for k, w in weights.items()}))
    first = backend.try_admit(Ticket("flood", "first", "sim"))
    assert isinstance(first, Admitted)
    tickets = [Ticket("flood", f"{k}-{i}", "sim", 0, k) for k, w in weights.items()
               for i in range(int(grants * w / total) + 3)]
    random.Random(7).shuffle(tickets)
    for t in tickets:
        backend.try_admit(t)
    served: list[str] = []
    slot = first.slot.slot_id
    for _ in range(grants):
        backend.release(slot)
        grant = backend.pending_grants("flood")[0]
        d = backend.try_admit(Ticket("flood", grant.task_id, "sim"))
        assert isinstance(d, Admitted)
        served.append(d.slot.fairness_key)
        slot = d.slot.slot_id
    return served


def share_gap(served: list[str], weights: dict[str, float]) -> float:
    """The worst gap, in admissions, of a key's count from its weight's share of all, over
    every prefix of *served*."""
    total, counts, worst = sum(weights.values()), dict.fromkeys(weights, 0), 0.0
    for n, key in enumerate(served, 1):
        counts[key] += 1
        worst = max(worst, max(abs(counts[k] - n * w / total) for k, w in weights.items()))
    return worst


def main(quick: bool = False, url: str = DEFAULT_URL) -> bool:
    seconds = 8.0 if quick else 20.0
    token = f"fcbench-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    b = RedisBackend(client, key_prefix=token)
    ok = True
    try:
        b.register(QueueConfig("plain", concurrency=10_000, fairness="key"))
        b.register(keyed("own10", 10))
        t0 = time.perf_counter()
        b.register(keyed("own100k", 100_000))
        registered = time.perf_counter() - t0
        rate = interleaved({"plain": pairs(b, "plain", 10), "own10": pairs(b, "own10", 10),
                            "own100k": pairs(b, "own100k", 10)}, seconds)
        b.register(QueueConfig("cplain", concurrency=1, fairness="key"))
        b.register(keyed("cown", 10, capacity=1))
        cyc = interleaved({"cplain": cycles(b, "cplain", 10, 200),
                           "cown": cycles(b, "cown", 10, 200)}, seconds)
        rng = random.Random(28)
        weights = {f"t{i}": round(rng.uniform(0.1, 10), 2) for i in range(20)}
        grants = 1000
        mem = flood(MemoryBackend(), weights, grants)
        red = flood(RedisBackend(client, key_prefix=token + "f"), weights, grants)
    finally:
        b.close()
        for key in list(client.scan_iter(match=f"*{token}*", count=1000)):
            client.delete(key)
        client.close()
    rows = [
        ("pair, weights + keys of their own / plain fairness=key",
         rate["plain"] / rate["own10"], 1.15),
        ("grant cycle, weights + keys of their own / plain", cyc["cplain"] / cyc["cown"], 1.15),
        ("pair, 100,000 keys with settings / 10", rate["own10"] / rate["own100k"], 1.1),
        ("weighted share, memory: share_error (<= 1: one admission per key)",
         share_error(mem, weights), 1.0),
        ("weighted share, Redis: share_error", share_error(red, weights), 1.0),
    ]
    print(f"pairs/s: plain {rate['plain']:.0f}, own10 {rate['own10']:.0f}, own100k "
          f"{rate['own100k']:.0f}; grant cycles/s: plain {cyc['cplain']:.0f}, weighted "
          f"{cyc['cown']:.0f}; registering 100,000 keys took {registered:.1f} s")
    print(f"flood: 20 keys, weights {min(weights.values())} to {max(weights.values())}, "
          f"{grants} grants; same order in memory and Redis: {mem == red}; worst gap of a "
          f"key's count from its share of all: {share_gap(mem, weights):.2f} admissions")
    for name, value, target in rows:
        met = value <= target + 1e-9
        ok = ok and met
        print(f"  {name:66} {value:6.3f}  target <= {target}  {'ok' if met else 'MISSED'}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return ok and mem == red


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--url", default=DEFAULT_URL)
    args = parser.parse_args()
    raise SystemExit(0 if main(args.quick, args.url) else 1)
