"""Throwaway Redis topologies a test owns, built of :class:`~tests.support.services.RedisServer`
(the distribution's ``redis-server``) on free loopback ports, in a dir of their own, keeping
nothing on disk, gone after the test.

``Cluster(workdir, replicas=0).start()``
    3 masters (``replicas=1``: each with a replica, ``--cluster-replicas 1``),
    ``cluster-node-timeout`` of :data:`NODE_TIMEOUT_MS`, so a killed master's replica takes
    over within a few seconds. :attr:`~Cluster.url` is the ``redis+cluster://`` URL of every
    node, :attr:`~Cluster.nodes` the ``(host, port)`` pairs. ``ReplicatedCluster`` is the
    replicated one.
``SentinelGroup(workdir).start()``
    One master, one replica and three Sentinels (quorum 2, ``down-after-milliseconds``
    :data:`DOWN_AFTER_MS`): ``redis-server --sentinel``, the same binary (Debian's
    ``redis-sentinel`` package only links it). :attr:`~SentinelGroup.url` is Celery's
    ``sentinel://...;sentinel://...`` form; the master's name is :data:`MASTER_NAME`.

``kill9`` is the crash (SIGKILL, no shutdown, unreplicated writes lost); ``cut_off`` stops a
replica and drops its link first, so that writes are lost for certain; ``wait_failover``
returns once the replica serves as master. A server that can't be started fails the test under
CI=true and skips it elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import redis

from tests.support.services import (
    RedisServer,
    free_cluster_port,
    need_binaries,
    quick_redis,
    run_quietly,
    service_unavailable,
)
from tests.support.waiting import wait_for

NODE_TIMEOUT_MS = 1000
DOWN_AFTER_MS = 1000
MASTER_NAME = "fcmaster"


def settled(check: Callable[[], bool]) -> Callable[[], bool]:
    """*check*, answering False while a server it asks is down or busy."""
    def quietly() -> bool:
        try:
            return check()
        except (redis.RedisError, OSError):
            return False
    return quietly


def cluster_ok(port: int) -> bool:
    """True when the node on ``port`` reports cluster_state:ok."""
    client = quick_redis(f"redis://127.0.0.1:{port}/0")
    try:
        return b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO")
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class Servers:
    """The ``redis-server`` processes of one topology, by port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.servers: dict[int, RedisServer] = {}

    def spawn(self, port: int, *args: str, conf: Path | None = None) -> RedisServer:
        """Start a server on *port* (0: a free one), not waiting for it."""
        server = RedisServer(self.workdir, port or None, args=args, conf=conf).spawn()
        self.servers[server.port] = server
        return server

    def wait_up(self, ports: list[int]) -> None:
        for port in ports:
            self.servers[port].wait_up()

    def alive(self, port: int) -> bool:
        return self.servers[port].running()

    def info(self, port: int, section: str) -> dict[str, str]:
        client = quick_redis(f"redis://127.0.0.1:{port}/0")
        try:
            return {k: str(v) for k, v in client.info(section).items()}
        finally:
            client.close()

    def replica_of(self, master: int) -> int:
        """The port of *master*'s (first) replica."""
        client = quick_redis(f"redis://127.0.0.1:{master}/0")
        try:
            return int(client.info("replication")["slave0"]["port"])
        finally:
            client.close()

    def offset(self, port: int) -> int:
        """The replication offset of the server on *port* (how much of the stream it has)."""
        info = self.info(port, "replication")
        return int(info.get("master_repl_offset") or info.get("slave_repl_offset") or 0)

    def cut_off(self, replica: int, master: int) -> None:
        """Stop *replica* (SIGSTOP) and drop its link on *master*: from now on what *master*
        writes stays in its backlog, not on the replica, until :meth:`resume`."""
        self.servers[replica].pause()
        client = quick_redis(f"redis://127.0.0.1:{master}/0")
        try:
            client.execute_command("CLIENT", "KILL", "TYPE", "replica")
        finally:
            client.close()

    def resume(self, port: int) -> None:
        """SIGCONT: a stopped server runs on."""
        self.servers[port].resume()

    def kill9(self, port: int) -> None:
        """SIGKILL: no shutdown, nothing saved, writes not yet sent to a replica are lost."""
        self.servers[port].kill9()

    def stop(self) -> None:
        for server in self.servers.values():
            server.kill9()


class Cluster(Servers):
    """3 masters (and a replica of each with ``replicas=1``) on free loopback ports (each
    port P and its bus port P + 10000)."""

    def __init__(self, workdir: Path, replicas: int = 0) -> None:
        super().__init__(workdir)
        self.replicas = replicas
        self.ports: list[int] = []

    def start(self) -> Cluster:
        (cli,) = need_binaries("Redis Cluster", "redis-cli")
        while len(self.ports) < 3 * (1 + self.replicas):
            self.ports.append(free_cluster_port(set(self.ports)))
        for port in self.ports:
            self.spawn(port, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                       "--cluster-node-timeout", str(NODE_TIMEOUT_MS))
        self.wait_up(self.ports)
        done = run_quietly([cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                            "--cluster-replicas", str(self.replicas), "--cluster-yes"], timeout=60)
        if done.returncode != 0:
            service_unavailable("Redis Cluster", "127.0.0.1",
                                f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")
        # `create` returns once the slots are assigned; gossip may still be settling, and the
        # replicas still have to sync.
        wait_for(settled(lambda: all(cluster_ok(p) for p in self.ports)
                         and len(self.masters()) == 3 and all(
                             self.info(p, "replication").get("master_link_status") == "up"
                             for p in self.ports if p not in self.masters())),
                 45, 0.1, f"the cluster on {self.ports} reports ok, every replica synced")
        return self

    @property
    def nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node."""
        return [("127.0.0.1", port) for port in self.ports]

    @property
    def url(self) -> str:
        """Every node, as ``flowcontrol_backend_url``."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def client(self) -> redis.cluster.RedisCluster:
        from redis.cluster import ClusterNode, RedisCluster

        alive = [p for p in self.ports if self.alive(p)]
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in alive])

    def slots(self) -> list[tuple[int, int, int]]:
        """(first slot, last slot, master port) of every range, as a live node sees it."""
        for port in self.ports:
            if not self.alive(port):
                continue
            client = quick_redis(f"redis://127.0.0.1:{port}/0")
            try:
                return [(int(r[0]), int(r[1]), int(r[2][1])) for r in client.execute_command("CLUSTER SLOTS")]
            except (redis.RedisError, OSError):
                continue
            finally:
                client.close()
        raise AssertionError("no cluster node answers CLUSTER SLOTS")

    def masters(self) -> set[int]:
        return {port for _, _, port in self.slots()}

    def keyslot(self, key: str) -> int:
        """CLUSTER KEYSLOT of *key*, asked of a live node."""
        port = next(p for p in self.ports if self.alive(p))
        client = quick_redis(f"redis://127.0.0.1:{port}/0")
        try:
            return int(client.execute_command("CLUSTER KEYSLOT", key))
        finally:
            client.close()

    def master_of(self, key: str) -> int:
        """The port of the master that owns *key*'s hash slot."""
        slot = self.keyslot(key)
        return next(port for first, last, port in self.slots() if first <= slot <= last)

    def wait_failover(self, dead: int, key: str, timeout: float = 30) -> int:
        """Once *key*'s slot is served by a live master other than *dead*: its port."""
        def promoted() -> bool:
            port = self.master_of(key)
            return port != dead and self.info(port, "replication")["role"] == "master" and cluster_ok(port)
        wait_for(settled(promoted), timeout, 0.1, f"a replica of {dead} to take over its slots")
        return self.master_of(key)


class ReplicatedCluster(Cluster):
    """3 masters + 3 replicas."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, replicas=1)


class SentinelGroup(Servers):
    """A master, its replica and three Sentinels (quorum 2) on free loopback ports."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.master = self.replica = 0
        self.sentinels: list[int] = []

    def start(self) -> SentinelGroup:
        self.master = self.spawn(0).port
        self.replica = self.spawn(0, "--replicaof", "127.0.0.1", str(self.master)).port
        self.wait_up([self.master, self.replica])
        wait_for(settled(lambda: self.info(self.replica, "replication").get("master_link_status") == "up"),
                 20, 0.1, "the replica to sync")
        for _ in range(3):
            server = RedisServer(self.workdir)
            conf = self.workdir / f"sentinel-{server.port}.conf"  # a Sentinel rewrites its own config
            conf.write_text(
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} 5000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n")
            self.spawn(server.port, "--sentinel", conf=conf)
            self.sentinels.append(server.port)
        self.wait_up(self.sentinels)
        # Each Sentinel must know the replica and the others before a failover can be voted.
        wait_for(settled(lambda: all(self._sentinel(p, "SENTINEL", "MASTER", MASTER_NAME) >= (1, 2)
                                     for p in self.sentinels)),
                 30, 0.1, "the Sentinels to see the replica and each other")
        return self

    def _sentinel(self, port: int, *command: str) -> tuple[int, int]:
        client = quick_redis(f"redis://127.0.0.1:{port}/0")
        try:
            reply = client.execute_command(*command)
        finally:
            client.close()
        fields = dict(zip(reply[::2], reply[1::2], strict=False)) if isinstance(reply, list) else reply
        fields = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
        return int(fields["num-slaves"]), int(fields["num-other-sentinels"])

    @property
    def url(self) -> str:
        """Celery's Sentinel form, as ``flowcontrol_backend_url``."""
        return ";".join(f"sentinel://127.0.0.1:{p}/0" for p in self.sentinels)

    @property
    def options(self) -> dict[str, object]:
        """``flowcontrol_backend_options`` of this group."""
        return {"master_name": MASTER_NAME, "socket_timeout": 5.0, "socket_connect_timeout": 2.0}

    def current_master(self) -> int:
        """The master's port, as the first Sentinel that answers says."""
        for port in self.sentinels:
            client = quick_redis(f"redis://127.0.0.1:{port}/0")
            try:
                return int(client.sentinel_get_master_addr_by_name(MASTER_NAME)[1])
            except (redis.RedisError, OSError, TypeError):
                continue
            finally:
                client.close()
        raise AssertionError("no Sentinel answers")

    def wait_failover(self, dead: int, timeout: float = 30) -> int:
        """Once the Sentinels name a master other than *dead* and it serves as one: its port."""
        wait_for(settled(lambda: self.current_master() != dead and
                         self.info(self.current_master(), "replication")["role"] == "master"),
                 timeout, 0.1, f"the Sentinels to promote a replica of {dead}")
        return self.current_master()
