"""Many worker nodes: 24 ``celery worker -P prefork -c 1`` nodes, one admission Redis, one
PostgreSQL parking database, 20,000 tasks over 50 flow queues of mixed caps and rates.

Too heavy for the test run (two cores carry 48 worker processes); run it by hand::

    python -m benchmarks.fleet24              # 24 nodes, 20,000 tasks: several minutes
    python -m benchmarks.fleet24 --quick      # 8 nodes, 4,000 tasks (what `python -m benchmarks` runs)

The admission Redis and the PostgreSQL cluster are this run's own (free loopback ports), so
their counters count nothing else: the Redis CPU per decision (``INFO cpu`` and
``INFO commandstats``: every EVALSHA is one script call, admissions, releases, heartbeats and
the pollers' grant checks alike) and the SQL commits per parked task (``pg_stat_database``
``xact_commit`` over the rows the parking table took, ``pg_stat_user_tables.n_tup_ins``). The
broker and the gauge stay on the shared Redis. The tasks go to the broker in blocks of 10 a
queue, so the nodes meet two or three queues at a time and reach their caps. The queues, one
of three kinds in turn: concurrency 1 to 8; a fixed-window rate (10 to 40 per second) with a
concurrency of 4; a sliding-window rate (10 to 40 per 2 s) with a concurrency of 2 to 6.
Every cap is judged on what the tasks measured (their intervals, the instants of their
admission on the admission Redis's clock), every task must finish, none twice.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis
import sqlalchemy

from benchmarks._fleet import REDIS_URL, Row, parser, table
from tests.support.harness import max_in_window, max_overlap, wait_for
from tests.support.projects.chaos import ChaosHarness
from tests.support.services import Postgres, RedisServer

#: Tasks of one queue sent one after another (see run).
BLOCK = 10


class OwnPostgres(Postgres):
    """The chaos suite's throwaway cluster, with room for every node's connections."""

    def start(self) -> OwnPostgres:
        if not (self.data / "PG_VERSION").exists():
            super().start()  # initdb, then a start with the suite's options ...
            self.stop()  # ... stopped to start again with ours
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} -c fsync=off " \
               "-c max_connections=300 -c shared_buffers=64MB"
        self._as_postgres("pg_ctl", "-D", str(self.data), "-o", opts, "-l",
                          str(self.data / "server.log"), "-w", "-t", "30", "start")
        return self


def queues(n: int) -> list[dict[str, Any]]:
    """*n* flow queues, one of three kinds in turn (the module docstring)."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append({"name": f"c{i}", "concurrency": (1, 2, 3, 5, 8)[i // 3 % 5], "retry": 1})
        elif kind == 1:
            out.append({"name": f"f{i}", "concurrency": 4, "retry": 1,
                        "rate_limit": {"limit": (10, 20, 40)[i // 3 % 3], "period": 1}})
        else:
            out.append({"name": f"s{i}", "concurrency": (2, 4, 6)[i // 3 % 3], "retry": 1,
                        "rate_limit": {"limit": (10, 20, 40)[i // 3 % 3], "period": 2,
                                       "algorithm": "sliding"}})
    return out


def judge(q: dict[str, Any], execs: list[Any], admitted: list[float]) -> tuple[bool, str, bool]:
    """Whether queue *q* kept its caps: (kept, what was measured, whether a cap was reached,
    so the verdict was put to the test)."""
    peak = max_overlap(execs)
    ok = peak <= q["concurrency"]
    reached = peak >= q["concurrency"]
    text = f"peak {peak}/{q['concurrency']}"
    rl = q.get("rate_limit")
    if rl:
        if rl.get("algorithm") == "sliding":
            most, _ = max_in_window(admitted, rl["period"])
        else:  # fixed windows start on multiples of the period (Redis TIME)
            buckets: dict[int, int] = defaultdict(int)
            for t in admitted:
                buckets[int(t // rl["period"])] += 1
            most = max(buckets.values(), default=0)
        ok = ok and most <= rl["limit"]
        reached = reached or most >= rl["limit"]
        text += f", rate {most}/{rl['limit']} per {rl['period']} s"
    return ok, text, reached


def pg_counters(url: str, table_name: str) -> tuple[int, int]:
    """(committed transactions of the database, rows inserted into *table_name*)."""
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_stat_force_next_flush()"))
            commits = conn.execute(sqlalchemy.text(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")).scalar()
            ins = conn.execute(sqlalchemy.text(
                "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE relname = :t"),
                {"t": table_name}).scalar()
        return int(commits or 0), int(ins or 0)
    finally:
        engine.dispose()


def redis_counters(client: redis.Redis) -> tuple[float, int]:
    """(CPU seconds the admission Redis used, its EVALSHA calls)."""
    info = client.info("cpu")
    calls = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"]), int(calls)


def run(nodes: int, tasks: int, n_queues: int = 50) -> list[Row]:
    from celery_flowcontrol.parking import migrate
    from celery_flowcontrol.parking.model import ParkedRow

    workdir = Path(tempfile.mkdtemp(prefix="fc-fleet24-"))
    admission = RedisServer(workdir / "redis").start()
    pg = OwnPostgres().start()
    qs = queues(n_queues)
    prefix = f"fcf-{uuid.uuid4().hex[:8]}"
    try:
        migrate(pg.url)
        conf = {"flowcontrol_backend_url": admission.url, "flowcontrol_parking_url": pg.url,
                "flowcontrol_queues": qs, "flowcontrol_instance_ttl": 30}
        h = ChaosHarness(workdir=workdir / "proj", broker_url=REDIS_URL, gauge_url=REDIS_URL,
                         prefix=prefix, conf=conf)
        try:
            # Everything is in the broker before the first node starts: every queue is
            # contended from the first second, not fed at the producer's pace.
            began = time.monotonic()
            per = tasks // len(qs)
            labels = []
            # In blocks of BLOCK a queue: the nodes take the broker's messages in order, so
            # at any moment the 24 in flight come from two or three queues, enough to reach
            # the caps (interleaved one by one, each queue would see about one at a time).
            for b in range(0, per, BLOCK):
                for q in qs:
                    for j in range(b, min(per, b + BLOCK)):
                        labels += h.submit(q["name"], 1, 0.005 * (j % 4), tag=f"{q['name']}-{j}-")
            sent = time.monotonic() - began
            rc = redis.Redis.from_url(admission.url)
            cpu0, calls0 = redis_counters(rc)
            commits0, ins0 = pg_counters(pg.url, ParkedRow.__tablename__)
            started = time.monotonic()
            made = [h.start_worker(1, name=f"n{i:02d}", wait=False)
                    for i in range(nodes)]
            for node in made:
                h.wait_ready(node, timeout=300)
            boot = time.monotonic() - started
            h.wait_done(labels, timeout=max(600, tasks / 10))
            took = time.monotonic() - started
            wait_for(lambda: h.parked() == 0, 60, what="the parking table to empty")
            time.sleep(1.5)  # PostgreSQL flushes its statistics at most once a second
            cpu1, calls1 = redis_counters(rc)
            commits1, ins1 = pg_counters(pg.url, ParkedRow.__tablename__)
            rc.close()
            done, runs = h.gauge.done(), h.gauge.runs()
            missing = [label for label in labels if label not in done]
            dups = sum(1 for label in labels if runs.get(label, 0) > 1)
            execs = h.gauge.executions()
            admitted: dict[str, list[float]] = defaultdict(list)
            for raw in h.gauge.client.lrange(h.gauge.key("admitted"), 0, -1):
                label, _, t = raw.decode().rpartition("|")
                admitted[label.split("-")[0]].append(float(t))
            verdicts = {q["name"]: judge(q, [r for r in execs if r.label.startswith(q["name"] + "-")],
                                         admitted[q["name"]]) for q in qs}
        finally:
            h.close()
    finally:
        pg.destroy()
        admission.stop()
    kept = sum(ok for ok, _, _ in verdicts.values())
    tested = sum(reached for _, _, reached in verdicts.values())
    parked = ins1 - ins0
    cpu_us = (cpu1 - cpu0) / len(labels) * 1e6
    call_us = (cpu1 - cpu0) / max(1, calls1 - calls0) * 1e6
    commits = commits1 - commits0
    print(f"fleet: {len(labels)} tasks sent in {sent:.0f} s, then {nodes} nodes started (all "
          f"ready in {boot:.0f} s); all done {took:.0f} s after the first start; "
          f"{len(missing)} missing, {dups} ran twice; caps kept on {kept}/{len(qs)} queues; "
          f"{parked} parks; admission Redis {cpu1 - cpu0:.1f} CPU-s for "
          f"{calls1 - calls0} script calls; PostgreSQL {commits} commits")
    for name, (ok, text, _) in verdicts.items():
        if not ok:
            print(f"  CAP EXCEEDED {name}: {text}")
    print("  " + "; ".join(f"{n} {t}" for n, (_, t, _) in list(verdicts.items())[:12]) + " ...")
    return [
        Row(f"tasks finished, {nodes} nodes, {n_queues} queues", len(labels) - len(missing),
            len(labels), "", (len(labels) - len(missing)) / len(labels), "= 1 (nothing lost)",
            not missing),
        Row("queues whose caps held (every one measured)", kept, len(qs), "", kept / len(qs),
            "= 1", kept == len(qs)),
        Row("(info) queues that reached a cap (the others never had the work at once)", tested,
            len(qs), "", tested / len(qs), "info", True),
        Row("(info) tasks that ran twice", dups, len(labels), "", dups / len(labels), "info", True),
        Row("(info) fleet throughput, tasks/s (boot included)", len(labels) / took, None, "/s",
            None, "info", True),
        Row("admission Redis CPU per task", cpu_us, call_us, "us", cpu_us / call_us,
            "info (baseline: per script call)", True),
        Row("(info) script calls per task", (calls1 - calls0) / len(labels), None, "", None,
            "info", True),
        Row("SQL commits per parked task", commits / max(1, parked), None, "", None,
            "info (polls included)", True),
        Row("(info) parked tasks, share of all", parked, len(labels), "", parked / len(labels),
            "info", True),
    ]


def main(quick: bool = False) -> bool:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=None)
    p.add_argument("--tasks", type=int, default=None)
    args = p.parse_args()
    quick = quick or args.quick
    nodes = args.nodes or (8 if quick else 24)
    tasks = args.tasks or (4000 if quick else 20_000)
    rows = run(nodes, tasks)
    print(table(f"fleet24: {nodes} worker nodes, one Redis, one PostgreSQL", rows))
    return all(r.ok for r in rows)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(0 if main() else 1)
