"""What one worker node's sweeps cost Redis a second, with 10 and with 10,000 queues registered
(benchmarks/sizing.py's rows; docs/sizing.md).

A node here is the worker's own parts, not a model of them: its :class:`Waker` chores (the
heartbeat, the reclaim pass, the pending-grant rescue, the poll of due rows on an empty SQLite
table) and its :class:`Reasserter` (re-assertion, the configured-queue check, every third pass
the stale check), over the index of what it holds (:class:`Holdings`). The node holds three
slots in two queues and waits in two more, and every registered queue is configured on it
(the worst case: ``flowcontrol_queues`` names them all). Its chores run on a fake clock, one
tick a simulated second (the default ``flowcontrol_poll_interval``), a heartbeat every 10 s
(``instance_ttl / 3``), a reclaim pass every 15 s; the Redis CPU they cost (``INFO cpu``, the
server's idle rate left out) over the simulated seconds is the figure.

Beside it, for information: the same node without the index (``holdings=None``: every sweep
over every registered queue, and a re-assertion of every configured queue each heartbeat, what
a node would cost without ``worker/holdings.py``), and the beat task's pass over every queue
(``flowcontrol.reclaim``, once a reclaim interval for the whole fleet).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from benchmarks._fleet import Row
from celery_flowcontrol.admission import Admitted, Ticket
from celery_flowcontrol.admission.redis import RedisBackend
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.engines import engines_of
from celery_flowcontrol.parking import ParkingStore
from celery_flowcontrol.testing import FakeClock
from celery_flowcontrol.worker.holdings import Holdings
from celery_flowcontrol.worker.ledger import Admission, Entry, Ledger
from celery_flowcontrol.worker.reassert import Reasserter
from celery_flowcontrol.worker.waker import Waker

#: The queues a node works in, registered under each prefix among the 10 or the 10,000.
NODE_QUEUES = [f"node{i}" for i in range(5)]
HEARTBEAT_EVERY, RECLAIM_EVERY = 10.0, 15.0


def cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def register_node_queues(backend: RedisBackend) -> None:
    for name in NODE_QUEUES:  # node0: room for two nodes' two slots
        backend.register(QueueConfig(name, concurrency=4 if name == "node0" else 2))


class Node:
    """A node's chores on *backend*: :meth:`second` is one simulated second of them."""

    def __init__(self, second: Callable[[], None], others: Callable[[], None]) -> None:
        self.second = second
        self.others = others  # renews the leases of the other instance's slots (not measured)


def node(app: Any, backend: RedisBackend, store: ParkingStore, tag: str, index: bool) -> Node:
    """A node (slots in node0 and node1, waiters in node2 and node3, each full with another
    instance's slots, kept alive between measurements: the same state all along)."""
    instance = f"bench-{tag}"
    ledger = Ledger()
    for i, name in enumerate(["node0", "node0", "node1"]):
        d = backend.try_admit(Ticket(name, f"{tag}-held{i}", instance))
        assert isinstance(d, Admitted), d
        ledger.add((d.slot.task_id, 1), Admission(entries=[Entry(d.slot, False)]))
        ledger.asked(name)
    for name in ("node2", "node3"):
        for i in range(2):  # full (a second node's others wait too)
            backend.try_admit(Ticket(name, f"{tag}-{name}-other{i}", f"other-{tag}"))
        assert not backend.try_admit(Ticket(name, f"{tag}-{name}-wait", instance)).admitted
        ledger.asked(name)
    holdings = Holdings(ledger) if index else None
    configured = [backend.get_config(n) for n in backend.queues()]
    reassert = Reasserter(backend=backend, instance=instance, ledger=ledger, configured=configured,
                          config_of=lambda name: None, holdings=holdings)
    clock = FakeClock()

    class EveryQueue:
        """A re-assertion without the index: every configured queue."""

        def reassert(self) -> None:
            reassert.reassert()
            for config in configured:
                backend.restore(instance, config, [e.slot for e in ledger.entries(config.name)])

    waker = Waker(app=app, backend=backend, store=store, instance=instance,
                  heartbeat_every=HEARTBEAT_EVERY, reclaim_every=RECLAIM_EVERY, clock=clock,
                  reassert=reassert if index else EveryQueue(), holdings=holdings)

    def second() -> None:
        waker._chores()
        clock.advance(1.0)

    return Node(second, lambda: backend.heartbeat(f"other-{tag}", queues=["node2", "node3"]))


def commands(client: redis.Redis) -> int:
    """Commands the server has answered (INFO commandstats), INFO itself left out."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def per_node_second(client: redis.Redis, node: Node, seconds: int) -> tuple[float, float]:
    """Redis CPU microseconds and commands per simulated second of *node*, the server's idle
    CPU rate left out."""
    node.others()
    idle0, t0 = cpu(client), time.perf_counter()
    time.sleep(0.5)
    idle = (cpu(client) - idle0) / (time.perf_counter() - t0)
    before, calls, t0 = cpu(client), commands(client), time.perf_counter()
    for _ in range(seconds):
        node.second()
    wall = time.perf_counter() - t0
    return (max(0.0, cpu(client) - before - idle * wall) / seconds * 1e6,
            (commands(client) - calls - 2) / seconds)  # the two INFO cpu reads left out


def node_rows(port: int, few: RedisBackend, many: RedisBackend, seconds: float) -> list[Row]:
    """The rows: a node's sweeps per node-second, 10,000 vs 10 registered (target <= 1.2), the
    same without the index (info), and the beat pass over every queue (info)."""
    client = redis.Redis(port=port)
    app = Celery("bench-sweeps", broker="memory://", set_as_current=False)
    app.conf.flowcontrol_parking_url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='fc-sweeps-')) / 'p.sqlite3'}"
    store = engines_of(app).store  # the one the batch sweep of the chores reads too
    try:
        simulated = max(120, int(seconds * 60))  # 12 heartbeats and 8 reclaim passes at least
        nodes = {name: node(app, b, store, name, True) for name, b in (("few", few), ("many", many))}
        cost = {"few": 0.0, "many": 0.0}
        calls = {"few": 0.0, "many": 0.0}
        for _ in range(3):  # interleaved: a busy spell on the machine hits both alike
            for name, each in nodes.items():
                us, n = per_node_second(client, each, simulated)
                cost[name] += us / 3
                calls[name] += n / 3
        before = {name: node(app, b, store, f"{name}-all", False) for name, b in (("few", few), ("many", many))}
        old = {name: per_node_second(client, each, 30)[0] for name, each in before.items()}
        start = cpu(client)
        many.reclaim()
        beat = cpu(client) - start
    finally:
        store.close()
        client.close()
    ratio = cost["many"] / cost["few"] if cost["few"] else float("inf")
    return [
        Row("a node's sweeps, Redis CPU/node-s, 10k vs 10", cost["many"],
            cost["few"], "us", ratio, "<= 1.2", ratio <= 1.2),
        Row("(info) the same: commands/node-s", calls["many"], calls["few"], "",
            calls["many"] / calls["few"], "info", True),
        Row("(info) the same, no index (every queue)", old["many"], old["few"], "us",
            old["many"] / old["few"] if old["few"] else None, "info", True),
        Row("(info) beat's reclaim pass, 10,000 queues", beat * 1e3, None,
            "ms", None, "info", True),
    ]
