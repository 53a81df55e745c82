"""Uncontended throughput: no-op FlowTasks through a flow queue of concurrency 1000 vs plain Tasks.

One worker, ``-P prefork -c 2``, Redis broker, Redis admission (every FlowTask is one admission
call in the consumer and one release when its result lands), SQLite parking (never used: the
cap is never reached). The queue is filled before the worker starts, so the worker runs flat
out; the rate is taken between the moment the backlog falls below N - 200 (warm) and the moment
the last message is acked (``task_acks_late``: an ack means the task finished). Each side runs
``--rounds`` times, alternating, and the best round counts (noise on a shared machine only ever
slows a round down). Beside it, for information: the worker main process's CPU time per task
(where the consumer's loop, and so admission, runs), least of the rounds, which moves far less
from round to round than the rate.

Target (issue 3): FlowTask / plain >= 0.85.

    python -m benchmarks.throughput            # 5,000 tasks, 5 rounds
    python -m benchmarks.throughput --quick    # 2,000 tasks, 3 rounds

On the 2-core machine of these runs a round of either side moves by 10% from one run to the
next (other tenants of the host), so a single round says little: each figure is a best of
several.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import redis

from benchmarks._fleet import REDIS_URL, Row, fleet, parser, table
from tests.e2e.harness import Harness

WARM = 200


def backlog(client: redis.Redis, h: Harness) -> int:
    """Messages ready plus delivered-but-unacked in this harness's broker queue.

    kombu's Redis transport keeps one list per priority step (``<queue>\\x06\\x16<n>``), and
    FlowTask maps ``flow_priority`` onto it, so every list of the queue is counted.
    """
    lists = [h.queue_name, *(f"{h.queue_name}\x06\x16{n}" for n in range(1, 10))]
    ready = sum(int(client.llen(f"{h.prefix}:{name}")) for name in lists)
    return ready + int(client.hlen(f"{h.prefix}:unacked"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rate(tasks: int, flow: bool) -> tuple[float, float]:
    """Tasks per second of one worker draining ``tasks`` queued no-ops, and the CPU time its
    main process (the consumer's loop, where admission runs) spent per task meanwhile."""
    conf = {"flowcontrol_queues": [{"name": "wide", "concurrency": 1000}]}
    with fleet(conf, flow=flow) as h:
        name, options = ("noop", {"flow_queue": "wide"}) if flow else ("plain_noop", {})
        for _ in range(tasks):
            h.send(name, **options)
        client = redis.Redis.from_url(REDIS_URL)
        try:
            pid = h.start_worker(2, loglevel="WARNING", wait=False).proc.pid
            deadline = time.monotonic() + 120 + tasks / 50
            while backlog(client, h) > tasks - WARM:
                if time.monotonic() > deadline:
                    raise AssertionError("the worker never started draining:\n" + h.logs(3000))
                time.sleep(0.005)
            began, cpu, left = time.perf_counter(), cpu_seconds(pid), backlog(client, h)
            while backlog(client, h) > 0:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{backlog(client, h)} messages never drained:\n" + h.logs(3000))
                time.sleep(0.005)
            return left / (time.perf_counter() - began), (cpu_seconds(pid) - cpu) / left
        finally:
            client.close()


def main(quick: bool = False, rounds: int | None = None) -> bool:
    """Run the rounds; print the table; True when the target is met."""
    tasks = 2000 if quick else 5000
    rounds = rounds or (3 if quick else 5)
    plain: list[tuple[float, float]] = []
    flow: list[tuple[float, float]] = []
    for _ in range(rounds):
        plain.append(rate(tasks, flow=False))
        flow.append(rate(tasks, flow=True))
    best_plain, best_flow = max(r for r, _ in plain), max(r for r, _ in flow)
    ratio = best_flow / best_plain
    # The main process's CPU per task moves far less from round to round than the rate does
    # (other tenants of the host slow a round down; they rarely change what a task costs):
    # the same comparison, steadier, for information (the target is on the rate).
    cpu_plain, cpu_flow = min(c for _, c in plain) * 1e6, min(c for _, c in flow) * 1e6
    rows = [Row(f"no-op tasks/s, {tasks} tasks, best of {rounds}", best_flow, best_plain, "/s", ratio, ">= 0.85",
                ratio >= 0.85),
            Row("main-process CPU per task (least of rounds)", cpu_flow, cpu_plain, "us",
                cpu_plain / cpu_flow, "-", True)]  # fmt: skip
    print(table("uncontended throughput: FlowTask (flow queue of 1000) vs plain Task, prefork -c 2, Redis", rows))
    print(f"rounds: FlowTask {', '.join(f'{r:.0f}' for r, _ in flow)}; plain {', '.join(f'{r:.0f}' for r, _ in plain)}")
    print(f"main-process CPU per task (us): FlowTask {', '.join(f'{c * 1e6:.0f}' for _, c in flow)}; "
          f"plain {', '.join(f'{c * 1e6:.0f}' for _, c in plain)}")
    return ratio >= 0.85


if __name__ == "__main__":
    p = parser(__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=None)
    args = p.parse_args()
    raise SystemExit(0 if main(quick=args.quick, rounds=args.rounds) else 1)
