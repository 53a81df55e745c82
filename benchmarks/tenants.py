"""Unequal tenants: what weights and per-key settings cost a decision, and how fair the
weighted share is. One Redis server, one run, each figure beside its baseline:

* an admit+release pair on a ``fairness="key"`` queue whose keys have weights and settings of
  their own (``keys=``: weight, concurrency, reserve, max_waiting) beside the same pair on
  a plain ``fairness="key"`` queue (target: at most 1.15x); and a *grant cycle* (release a
  slot of a full queue: the next waiter by weight is granted; it confirms) on the two
  queues, every key backlogged (target: at most 1.15x);
* the same pair with 100,000 keys with settings of their own beside 10 (target: at most
  1.1x): a key's settings are read only for the keys a decision touches; and the longest
  call of registering those 100,000 keys (written in chunks: target at most 100 ms, as the
  client waits for it, so Redis is held no longer);
* the weighted share over a simulated flood: 20 keys of random weights (0.1 to 10), every
  one backlogged, one slot, 1,000 grants in turn, in the memory reference and in Redis
  (target: within one admission per key: for every two keys and every stretch, their
  admissions per unit of weight differ by at most one admission of each,
  :func:`~celery_flowcontrol.testing.contract_tenants.share_error` <= 1), and every key
  within one admission of its fluid share at every count
  (:func:`~celery_flowcontrol.testing.contract_tenants.fluid_gap` <= 1); how far the order
  is from its exact ideal (:func:`exact_order`): each choice's rank beside the least exact
  rank then (target: no more than float rounding, 1e-12 of the rank), and the worst
  difference of a key's count from the ideal's after as many admissions (target: 1); and the
  rule itself over 200 more floods of the same kind (other seeds), ranked by midpoints and, for
  comparison, by start tags alone: the worst gap from the fluid share and how many floods
  have a key off by more than one admission (:func:`other_floods`).

Which ideal. The queue serves by weighted fair queueing by virtual time (admission/lines.py):
the line with the least rank goes next (its tag, the virtual start time of its next admission,
plus 0.5 / weight: that admission's midpoint), its tag moving on by cost / weight, ties by the
arrival of each line's head; a key that starts waiting takes the virtual time (its own tag if
ahead). Its ideal is that same rule in exact rational arithmetic, with the weights the queue
holds (binary doubles, taken exactly): what floats, Lua's number formatting or a tie broken
another way would add shows against it. It shows one thing: where two keys' exact ranks tie
or nearly so, the ranks summed in doubles differ in their last bit and decide the tie instead
of arrival, so the two keys' admissions come swapped: a key's count off the ideal's by one at
most, never growing, since the tags themselves stay exact to float rounding: the algorithm
does not drift.

The *fluid* share (key k's n * w_k / W after n admissions, the GPS ideal): every key of the
flood waits from the start. Ranked by start tags alone, the first round would be served by
arrival, and a heavy key that arrived last would lag its fluid share by up to (N - 1) * w_k / W
admissions (N keys, W the sum of the weights: 2.47 for the heaviest key here). Ranked by
midpoints, each key is let in as its weight says: at most 1/2 + N * w_k / (2 * W) off, within
one admission for a key of at most the mean weight; a heavier key may pass one admission in
some floods (keys far apart in weight), which :func:`other_floods` counts. The pairwise bound
is kept either way: it is start-time fair queueing on ranks.

Pairs and cycles are measured in turns of 20 calls, the two arms round robin in one loop, so
a busy spell on a shared machine hits both alike::

    python -m benchmarks.tenants            # about 60 s
    python -m benchmarks.tenants --quick    # about 30 s
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import time
import uuid
from collections import deque
from collections.abc import Callable
from fractions import Fraction

import redis

from benchmarks.admission import interleaved
from celery_flowcontrol.admission import AdmissionBackend, Admitted, MemoryBackend, Ticket
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.testing.contract_tenants import fluid_gap, share_error

DEFAULT_URL = os.environ.get("FLOWCONTROL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def keyed(name: str, keys: int, capacity: int = 10_000) -> QueueConfig:
    """A fairness="key" queue; *keys* keys ("k0"...) with settings of their own: a weight
    (1 to 5), a concurrency, a reserve of 1 and a waiting bound."""
    own = {"concurrency": max(1, capacity // 2), "reserve": 1, "max_waiting": 100_000}
    return QueueConfig(name, concurrency=capacity, fairness="key",
                       keys={f"k{i}": dict(own, weight=1 + i % 5) for i in range(keys)})


def timed_register(b: RedisBackend, config: QueueConfig) -> tuple[int, float]:
    """Register *config*: how many calls to Redis it took, and the longest (s)."""
    run, times = b.scripts.run, []

    def timed(name: str, queue: str, *args: object) -> object:
        t0 = time.perf_counter()
        try:
            return run(name, queue, *args)
        finally:
            times.append(time.perf_counter() - t0)

    b.scripts.run = timed  # type: ignore[method-assign]
    try:
        b.register(config)
    finally:
        del b.scripts.run  # the method again
    return len(times), max(times)


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
    b.try_admit_many(waiting)

    def cycle() -> None:
        b.release(held[0])
        grant = b.pending_grants(queue)[0]
        d = b.try_admit(Ticket(queue, grant.task_id, "bench"))
        assert isinstance(d, Admitted), d
        held[0] = d.slot.slot_id
        b.try_admit(Ticket(queue, f"w{next(counter)}", "bench", 0, d.slot.fairness_key))
    return cycle


def arrivals(weights: dict[str, float], grants: int) -> list[str]:
    """The flood's calls, by key, in the order they arrive (enough of each key to stay
    backlogged over *grants* grants, shuffled)."""
    total = sum(weights.values())
    keys = [k for k, w in weights.items() for _ in range(int(grants * w / total) + 3)]
    random.Random(7).shuffle(keys)
    return keys


def flood(backend: AdmissionBackend, weights: dict[str, float], grants: int) -> list[str]:
    """The keys served, in order, over *grants* grants of one slot, every key backlogged."""
    backend.register(QueueConfig("flood", concurrency=1, fairness="key",
                                 keys={k: {"weight": w} for k, w in weights.items()}))
    first = backend.try_admit(Ticket("flood", "first", "sim"))
    assert isinstance(first, Admitted)
    tickets = [Ticket("flood", f"{k}-{i}", "sim", 0, k)
               for i, k in enumerate(arrivals(weights, grants))]
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


def exact_order(weights: dict[str, float], grants: int) -> list[str]:
    """The flood's ideal serving order: weighted fair queueing by virtual time in exact
    rationals (each weight the double the queue holds). Every key waits from the start, so its
    tag starts at virtual time 0 and moves on by 1 / weight per admission; the least rank
    (tag + 1 / (2 * weight)) goes first, ties by the arrival of each key's oldest waiting
    call."""
    lines: dict[str, deque[int]] = {k: deque() for k in weights}
    for seq, key in enumerate(arrivals(weights, grants)):
        lines[key].append(seq)
    step = {k: 1 / Fraction(w) for k, w in weights.items()}
    tag = {k: step[k] / 2 for k in weights}  # the rank: the tag plus half a step
    served = []
    for _ in range(grants):
        key = min((k for k in lines if lines[k]), key=lambda k: (tag[k], lines[k][0]))
        lines[key].popleft()
        tag[key] += step[key]
        served.append(key)
    return served


def ideal_excess(served: list[str], weights: dict[str, float]) -> tuple[int, float]:
    """Replay *served* against exact ranks (as :func:`exact_order` keeps them): how many of
    its choices were not the ideal's (the least exact rank, ties by arrival), and the worst
    excess of such a choice's rank over the least, relative to it."""
    lines: dict[str, deque[int]] = {k: deque() for k in weights}
    for seq, key in enumerate(arrivals(weights, len(served))):
        lines[key].append(seq)
    tag = {k: 1 / (2 * Fraction(w)) for k, w in weights.items()}
    other, worst = 0, 0.0
    for key in served:
        best = min((k for k in lines if lines[k]), key=lambda k: (tag[k], lines[k][0]))
        if best != key:
            other += 1
            worst = max(worst, float((tag[key] - tag[best]) / tag[key]))
        lines[key].popleft()
        tag[key] += 1 / Fraction(weights[key])
    return other, worst


def deviation(served: list[str], ideal: list[str]) -> int:
    """The worst difference, in admissions, between a key's count in *served* and in
    *ideal* after the same number of admissions (0: the same order)."""
    mine: dict[str, int] = {}
    theirs: dict[str, int] = {}
    worst = 0
    for a, b in zip(served, ideal, strict=True):
        mine[a] = mine.get(a, 0) + 1
        theirs[b] = theirs.get(b, 0) + 1
        worst = max(worst, abs(mine[a] - theirs.get(a, 0)), abs(mine.get(b, 0) - theirs[b]))
    return worst


def other_floods(floods: int = 200, grants: int = 1000) -> dict[str, tuple[float, int]]:
    """The serving rule alone (in floats) over *floods* floods like the benchmark's, seeds
    other than its own: 20 keys of random weights, every one backlogged from the start,
    arrivals shuffled. For ranks by midpoints (the queue's rule) and by start tags alone:
    the worst gap of a key's count from its fluid share over every flood, and in how many
    floods a key is off by more than one admission."""
    out: dict[str, tuple[float, int]] = {}
    for name, half in (("midpoints", 0.5), ("start tags", 0.0)):
        worst, over = 0.0, 0
        for seed in range(floods):
            rng = random.Random(10_000 + seed)
            weights = [round(rng.uniform(0.1, 10), 2) for _ in range(20)]
            arrival = random.Random(seed).sample(range(20), 20)
            total = sum(weights)
            heap = [(half / w, arrival[k], k) for k, w in enumerate(weights)]
            heapq.heapify(heap)
            counts, gap = [0] * 20, 0.0
            for n in range(1, grants + 1):
                rank, order, k = heapq.heappop(heap)
                counts[k] += 1
                heapq.heappush(heap, (rank + 1 / weights[k], order, k))
                gap = max(gap, max(abs(c - n * w / total) for c, w in zip(counts, weights, strict=True)))
            worst, over = max(worst, gap), over + (gap > 1)
        out[name] = (worst, over)
    return out


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
        calls, longest = timed_register(b, keyed("own100k", 100_000))
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
        ideal = exact_order(weights, grants)
        others = other_floods()
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
        ("registering 100,000 keys: the longest call (ms)", longest * 1000, 100),
        ("weighted share, memory: share_error (<= 1: one admission per key)",
         share_error(mem, weights), 1.0),
        ("weighted share, Redis: share_error", share_error(red, weights), 1.0),
        ("weighted share: a choice's rank over the exact least (relative, 1e-12 = 1)",
         max(ideal_excess(mem, weights)[1], ideal_excess(red, weights)[1]) / 1e-12, 1.0),
        ("weighted share: a key's count off the exact ideal's (admissions)",
         max(deviation(mem, ideal), deviation(red, ideal)), 1),
        ("weighted share, memory: worst gap from the fluid share n*w/W (admissions)",
         fluid_gap(mem, weights), 1.0),
        ("weighted share, Redis: worst gap from the fluid share", fluid_gap(red, weights), 1.0),
    ]
    print(f"pairs/s: plain {rate['plain']:.0f}, own10 {rate['own10']:.0f}, own100k "
          f"{rate['own100k']:.0f}; grant cycles/s: plain {cyc['cplain']:.0f}, weighted "
          f"{cyc['cown']:.0f}; registering 100,000 keys took {registered:.1f} s in {calls} "
          f"calls")
    print(f"flood: 20 keys, weights {min(weights.values())} to {max(weights.values())}, "
          f"{grants} grants; same order in memory and Redis: {mem == red}; choices not the "
          f"exact ideal's (float near-ties): {ideal_excess(mem, weights)[0]}")
    for name, (worst, over) in others.items():
        print(f"200 other floods, ranked by {name}: worst gap from the fluid share {worst:.2f} "
              f"admissions; floods with a key off by more than one: {over}")
    rows.append(("200 other floods: floods with a key off its fluid share by > 1",
                 others["midpoints"][1], 0))
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
