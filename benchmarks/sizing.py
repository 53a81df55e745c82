"""Sizing figures: what one Redis core, one Redis Cluster shard and the CLI sustain.

Every figure is measured on servers this script starts on free loopback ports (so the CPU
counters of ``INFO cpu`` belong to admission alone, not to a broker or another test run), each
beside a baseline from the same run:

* **one hot queue**: admit+release pairs on one queue through the worker's hot path; the
  Redis CPU one pair costs (``used_cpu_sys + used_cpu_user`` delta / pairs), so the pairs one
  Redis core sustains, vs two ``EVALSHA "return 1"`` (the cheapest script round trips);
* **many queues**: the same, round robin over 1,000 queues, vs the hot queue (the keys of
  a queue stay small, so spreading costs nothing on one server);
* **10,000 registered queues vs 10**: the latency (median) and the Redis CPU of a pair on one
  queue, with 10 and with 10,000 queues registered under the prefix (target <= 1.2); the
  Redis CPU a worker node's sweeps cost per node-second (heartbeat, reclaim, grant rescue,
  re-assertion: benchmarks/_sweeps.py runs the worker's own parts on a fake clock), the node
  holding the same slots and waiters in both (target <= 1.2); and, for information, the same
  node sweeping every registered queue (no index), one sweep of every queue (grants, heartbeat)
  and the beat task's reclaim pass over every queue;
* **1 vs 3 cluster masters**: one client process per master, each paced at 400 pairs/s over
  1,200 queues through ``redis+cluster://`` (so every master carries the same load in both
  runs); the capacity is the pairs per CPU-second of the busiest master (the shard that
  saturates first; each node's idle CPU left out), 3 masters vs 1 (target >= 2.4). On this
  2-core machine the wall-clock throughput can't grow with shards (servers and clients share
  two cores, and the clients are paced): it is not a figure here;
* **``celery flowcontrol list``** with 10,000 queues (its first page of 1,000) vs 10 queues,
  a real ``celery`` subprocess (target < 2 s; the whole 10,000 with ``--limit 0``: info).

::

    python -m benchmarks.sizing            # about 100 s
    python -m benchmarks.sizing --quick    # about 90 s

docs/sizing.md turns these figures into a model of the fleet one Redis, one cluster and one
PostgreSQL serve; benchmarks/fleet24.py checks the model against 24 worker nodes.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from benchmarks._fleet import Row, parser, table
from benchmarks._sweeps import node_rows, register_node_queues
from celery_flowcontrol.admission import Admitted, Ticket, backend_from_url
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig
from tests.support.services import RedisServer, free_cluster_port, free_port
from tests.support.topology import Servers, cluster_ok, settled
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]


def cpu(client: redis.Redis) -> float:
    """CPU seconds the server has used (system + user, every thread)."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def pairs_over(backend: RedisBackend, queues: list[str], n: int, tag: str, first: int = 0) -> float:
    """*n* admit+release pairs, round robin over *queues* from the *first*; the seconds they took."""
    start = time.perf_counter()
    for i in range(first, first + n):
        d = backend.try_admit(Ticket(queues[i % len(queues)], f"{tag}{i}", "bench"))
        assert isinstance(d, Admitted), d
        backend.release(d.slot.slot_id)
    return time.perf_counter() - start


def per_pair(client: redis.Redis, run: Callable[[], object], n: int) -> float:
    """Redis CPU microseconds per pair of *run* (which makes *n* pairs)."""
    before = cpu(client)
    run()
    return (cpu(client) - before) / n * 1e6


def one_server(seconds: float) -> list[Row]:
    """The hot queue, many queues, and 10 vs 10,000 registered, on a server of our own."""
    server = RedisServer(Path(tempfile.mkdtemp(prefix="fc-sizing-"))).start()
    client = redis.Redis(port=server.port)
    try:
        few = RedisBackend(redis.Redis(port=server.port), key_prefix="few")
        many = RedisBackend(redis.Redis(port=server.port), key_prefix="many")
        for b in (few, many):
            b.register(QueueConfig("hot", concurrency=100))
        spread = [f"s{i}" for i in range(1000)]
        for name in spread + [f"r{i}" for i in range(4)]:
            (many if name.startswith("s") else few).register(QueueConfig(name, concurrency=100))
        for b in (few, many):
            register_node_queues(b)  # where the node of the sweep figures works (_sweeps.py)
        for i in range(8994):  # 10,000 in all under "many": hot, s0..s999, node0..node4, these
            many.register(QueueConfig(f"idle{i}", concurrency=5))
        assert (len(many.queues()), len(few.queues())) == (10_000, 10), (len(many.queues()), len(few.queues()))
        sha = client.script_load("return 1")
        n = max(2000, int(seconds * 1500))
        hot = per_pair(client, lambda: pairs_over(few, ["hot"], n, "h"), n)
        spread_cost = per_pair(client, lambda: pairs_over(many, spread, n, "s"), n)
        trivial = per_pair(client, lambda: [client.evalsha(sha, 0) for _ in range(2 * n)], n)
        # 10 vs 10,000 registered: one queue each, latencies of single pairs, interleaved.
        lat: dict[str, list[float]] = {"few": [], "many": []}
        cost = {"few": 0.0, "many": 0.0}
        for turn in range(10):
            for name, b in (("few", few), ("many", many)):
                before = cpu(client)
                for i in range(n // 10):
                    t = time.perf_counter()
                    d = b.try_admit(Ticket("hot", f"l{turn}-{i}", "bench"))
                    assert isinstance(d, Admitted)
                    b.release(d.slot.slot_id)
                    lat[name].append(time.perf_counter() - t)
                cost[name] += cpu(client) - before
        med = {k: statistics.median(v) * 1e6 for k, v in lat.items()}
        per = {k: v / (n // 10 * 10) * 1e6 for k, v in cost.items()}
        # A sweep of every registered queue (pending_grants, heartbeat): what a worker instance
        # would send once a poll interval and once a heartbeat (instance_ttl / 3) without the
        # index of what it holds (worker/holdings.py); the beat task's pass is of this kind.
        sweeps = {}
        for name, b in (("few", few), ("many", many)):
            before = cpu(client)
            for _ in range(5):
                b.pending_grants()
            grants_cpu = (cpu(client) - before) / 5
            before = cpu(client)
            for _ in range(5):
                b.heartbeat("bench-instance")
            sweeps[name] = (grants_cpu, (cpu(client) - before) / 5)
        nodes = node_rows(server.port, few, many, seconds)
        for b in (few, many):
            b.close()
    finally:
        client.close()
        server.stop()
    return [
        Row("one hot queue: pairs per Redis core-second", 1e6 / hot, 1e6 / trivial, "/s",
            trivial / hot, "info", True),
        Row("(Redis CPU per pair, one hot queue)", hot, trivial, "us", hot / trivial, "info", True),
        Row("1,000 queues round robin: pairs per core-second", 1e6 / spread_cost, 1e6 / hot, "/s",
            hot / spread_cost, ">= 0.8", hot / spread_cost >= 0.8),
        Row("pair latency, 10,000 vs 10 registered queues", med["many"], med["few"], "us",
            med["many"] / med["few"], "<= 1.2", med["many"] / med["few"] <= 1.2),
        Row("Redis CPU per pair, 10,000 vs 10 registered", per["many"], per["few"], "us",
            per["many"] / per["few"], "<= 1.2", per["many"] / per["few"] <= 1.2),
        Row("(info) a grant sweep of every queue, 10k vs 10", sweeps["many"][0] * 1e3,
            sweeps["few"][0] * 1e3, "ms", sweeps["many"][0] / sweeps["few"][0], "info", True),
        Row("(info) a heartbeat of every queue, 10k vs 10", sweeps["many"][1] * 1e3,
            sweeps["few"][1] * 1e3, "ms", sweeps["many"][1] / sweeps["few"][1], "info", True),
        *nodes,
    ]


# -- the cluster: 1 master vs 3 -------------------------------------------------------------


class Cluster(Servers):
    """*masters* cluster nodes without replicas, the slots split evenly among them."""

    def __init__(self, masters: int) -> None:
        super().__init__(Path(tempfile.mkdtemp(prefix=f"fc-sizing-c{masters}-")))
        self.ports = []
        while len(self.ports) < masters:
            port = free_cluster_port(set(self.ports))
            if port not in self.ports:
                self.ports.append(port)

    def start(self) -> Cluster:
        for port in self.ports:
            self.spawn(port, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf")
        self.wait_up(self.ports)
        # ADDSLOTSRANGE and MEET by hand: `redis-cli --cluster create` wants 3 masters at least.
        share = 16384 // len(self.ports)
        for i, port in enumerate(self.ports):
            c = redis.Redis(port=port)
            last = 16383 if i == len(self.ports) - 1 else (i + 1) * share - 1
            c.execute_command("CLUSTER ADDSLOTSRANGE", i * share, last)
            if i:
                c.execute_command("CLUSTER MEET", "127.0.0.1", self.ports[0])
            c.close()
        wait_for(settled(lambda: all(cluster_ok(p) for p in self.ports)), 30, 0.1, "the cluster to report ok")
        return self

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def cpus(self) -> list[float]:
        out = []
        for port in self.ports:
            c = redis.Redis(port=port)
            out.append(cpu(c))
            c.close()
        return out

    def script_seconds(self) -> list[float]:
        """Seconds each node spent inside EVALSHA (INFO commandstats), I/O left out."""
        return [stat.get("usec", 0) / 1e6 for stat in self._evalsha()]

    def script_calls(self) -> list[int]:
        """EVALSHA calls each node answered."""
        return [int(stat.get("calls", 0)) for stat in self._evalsha()]

    def _evalsha(self) -> list[dict[str, Any]]:
        out = []
        for port in self.ports:
            c = redis.Redis(port=port)
            out.append(c.info("commandstats").get("cmdstat_evalsha", {}))
            c.close()
        return out


#: Pairs per second each master is sent, in both runs (see cluster_rows).
PER_MASTER = 400


def _drive(url: str, prefix: str, queues: list[str], seconds: float, rate: float,
           done: object) -> None:
    backend = backend_from_url(url, key_prefix=prefix)
    tag = uuid.uuid4().hex[:6]
    n, start = 0, time.monotonic()
    while time.monotonic() < start + seconds:
        n += 20
        pairs_over(backend, queues, 20, f"{tag}-", n - 20)  # every queue in turn
        ahead = start + n / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)  # paced: the same load per master in both runs
    backend.close()
    done.put(n)  # type: ignore[attr-defined]


def cluster_run(c: Cluster, seconds: float,
                clients: int) -> tuple[int, float, list[float], list[float], list[int]]:
    """(pairs, wall seconds, each master's CPU seconds beyond its idle rate, inside EVALSHA,
    and its EVALSHA calls so far) of one load."""
    prefix = "sz"
    queues = [f"c{i}" for i in range(1200)]  # ~400 a master: shares within a few percent
    b = backend_from_url(c.url, key_prefix=prefix)
    for q in queues:
        b.register(QueueConfig(q, concurrency=1000))
    b.close()
    # What an idle node costs (cron, the cluster bus) does not grow with the load: left out.
    idle0 = c.cpus()
    time.sleep(2.0)
    idle = [(a - b) / 2.0 for a, b in zip(c.cpus(), idle0, strict=True)]
    ctx = multiprocessing.get_context("fork")
    done = ctx.Queue()
    before, inside, started = c.cpus(), c.script_seconds(), time.monotonic()
    procs = [ctx.Process(target=_drive, args=(c.url, prefix, queues, seconds, PER_MASTER, done))
             for _ in range(clients)]
    for p in procs:
        p.start()
    total = sum(done.get(timeout=seconds + 60) for _ in procs)
    wall = time.monotonic() - started
    for p in procs:
        p.join(10)
    spent = [a - b - i * wall for a, b, i in zip(c.cpus(), before, idle, strict=True)]
    scripts = [a - b for a, b in zip(c.script_seconds(), inside, strict=True)]
    return total, wall, spent, scripts, c.script_calls()


def cluster_rows(seconds: float) -> list[Row]:
    clusters = {1: Cluster(1).start(), 3: Cluster(3).start()}
    sums: dict[int, list[Any]] = {m: [0, 0.0, [0.0] * m, [0.0] * m] for m in clusters}
    try:
        for _ in range(3):  # 1, 3, 1, 3, ...: a busy spell on the machine hits both alike
            for m, c in clusters.items():
                # One client per master, each paced at PER_MASTER pairs/s over all queues:
                # every master carries the same load in both runs, so neither pays more per
                # call for being less busy (a server woken for one command at a time spends
                # more per command than one that finds several ready). Two cores can't
                # saturate three servers and their clients; equal load is the fair stand-in.
                pairs, wall, spent, scripts, calls = cluster_run(c, max(4.0, seconds / 2), m)
                sums[m][0] += pairs
                sums[m][1] += wall
                sums[m][2] = [a + b for a, b in zip(sums[m][2], spent, strict=True)]
                sums[m][3] = [a + b for a, b in zip(sums[m][3], scripts, strict=True)]
    finally:
        for c in clusters.values():
            c.stop()
    one, three = ((s[0] / max(s[2]), s[0] / s[1], [x / sum(s[2]) for x in s[2]],
                   s[0] / max(s[3])) for s in (sums[1], sums[3]))
    balance = 1 / (max(calls) / sum(calls))  # of the 3-master cluster, its calls so far
    print(f"cluster: 1 master {one[0]:,.0f} pairs/CPU-s ({one[1]:,.0f}/s wall); 3 masters "
          f"{three[0]:,.0f} pairs/CPU-s of the busiest ({three[1]:,.0f}/s wall), shares "
          f"{', '.join(f'{s:.2f}' for s in three[2])}")
    return [
        Row("cluster capacity (busiest master), 3 vs 1 masters", three[0], one[0], "/s",
            three[0] / one[0], ">= 2.4", three[0] / one[0] >= 2.4),
        Row("(info) the same, by time inside EVALSHA", three[3], one[3], "/s",
            three[3] / one[3], "info", True),
        # Were every call as cheap on each master, capacity would grow by this much: the
        # calls' spread alone (the queues' hash slots), without the machine's contention.
        Row("(info) 3 masters: total calls / busiest master's", balance, 1.0, "x", balance,
            "info", True),
    ]


# -- the CLI ---------------------------------------------------------------------------------

PROJ = """from celery import Celery
app = Celery("proj", broker="memory://")
app.conf.update(flowcontrol_backend_url={url!r}, flowcontrol_key_prefix={prefix!r},
                flowcontrol_parking_url={parking!r})
"""


def list_seconds(workdir: Path, url: str, prefix: str, *args: str) -> float:
    """Wall time of ``celery -A proj flowcontrol list`` (a fresh process), best of 5."""
    (workdir / "proj.py").write_text(PROJ.format(url=url, prefix=prefix,
                                                 parking=f"sqlite:///{workdir / 'p.sqlite3'}"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir), str(REPO)])}
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "celery", "-A", "proj", "flowcontrol", "list",
                               *args], cwd=workdir, env=env, capture_output=True, text=True,
                              check=False)  # noqa: S603
        best = min(best, time.perf_counter() - start)
        assert done.returncode == 0, done.stderr
    return best


def cli_rows() -> list[Row]:
    port = free_port()
    server = RedisServer(Path(tempfile.mkdtemp(prefix="fc-sizing-cli-")), port).start()
    try:
        url = server.url
        small, big = RedisBackend.from_url(url, key_prefix="s10"), RedisBackend.from_url(url, key_prefix="s10k")
        for i in range(10):
            small.register(QueueConfig(f"q{i:05d}", concurrency=3))
        for i in range(10_000):
            big.register(QueueConfig(f"q{i:05d}", concurrency=3))
        workdir = Path(server.workdir)
        paged = list_seconds(workdir, url, "s10k")
        base = list_seconds(workdir, url, "s10")
        whole = list_seconds(workdir, url, "s10k", "--limit", "0")
        small.close()
        big.close()
    finally:
        server.stop()
    return [
        Row("flowcontrol list, 10,000 queues (page of 1,000)", paged, base, "s", paged / base,
            "< 2 s", paged < 2.0),
        Row("(info) flowcontrol list --limit 0, all 10,000", whole, base, "s", whole / base,
            "info", True),
    ]


def main(quick: bool = False) -> bool:
    args = parser(__doc__.splitlines()[0]).parse_args()
    quick = quick or args.quick
    seconds = 3.0 if quick else 6.0
    rows = one_server(seconds) + cluster_rows(seconds) + cli_rows()
    print(table("sizing: one Redis core, cluster shards, the CLI at 10,000 queues", rows))
    return all(r.ok for r in rows)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
