"""Throwaway Redis topologies a test owns: a Redis Cluster with replicas, and a master with a
replica watched by Sentinels, each started from the distribution's ``redis-server`` on free
loopback ports, in a dir of its own, keeping nothing on disk, gone after the test.

``ReplicatedCluster(workdir).start()``
    3 masters and 3 replicas (``--cluster-replicas 1``), ``cluster-node-timeout`` of
    :data:`NODE_TIMEOUT_MS`, so a killed master's replica takes over within a few seconds.
    :meth:`~ReplicatedCluster.url` is the ``redis+cluster://`` URL of every node.
``SentinelGroup(workdir).start()``
    One master, one replica and three Sentinels (quorum 2, ``down-after-milliseconds``
    :data:`DOWN_AFTER_MS`): ``redis-server --sentinel``, the same binary (Debian's
    ``redis-sentinel`` package only links it). :meth:`~SentinelGroup.url` is Celery's
    ``sentinel://...;sentinel://...`` form; the master's name is :data:`MASTER_NAME`.

``kill9`` is the crash (SIGKILL, no shutdown, unreplicated writes lost); ``cut_off`` stops a
replica and drops its link first, so that writes are lost for certain; ``wait_failover``
returns once the replica serves as master. A server that can't be started fails the test under
CI=true and skips it elsewhere (``tests.conftest.service_unavailable``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.conftest import cluster_ok, free_cluster_port, quick_redis, run_quietly, service_unavailable

NODE_TIMEOUT_MS = 1000
DOWN_AFTER_MS = 1000
MASTER_NAME = "fcmaster"


def _binaries() -> tuple[str, str]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        service_unavailable("Redis topology", "127.0.0.1", "redis-server and redis-cli are needed")
    return server, cli


def _wait(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:g} s")
        time.sleep(0.1)


class _Servers:
    """``redis-server`` processes of one topology, by port."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.server, self.cli = _binaries()

    def spawn(self, port: int, *args: str, conf: str | None = None) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / f"redis-{port}.log").open("ab")
        head = [self.server] if conf is None else [self.server, conf]
        self.procs[port] = subprocess.Popen(  # noqa: S603 - the distribution's binary
            [*head, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--protected-mode", "no", *args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def answers(self, port: int) -> bool:
        client = quick_redis(f"redis://127.0.0.1:{port}/0")
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def wait_up(self, ports: list[int]) -> None:
        for port in ports:
            try:
                _wait(lambda port=port: self.answers(port), 15, f"redis-server on {port} answers")
            except AssertionError as exc:
                log = (self.workdir / f"redis-{port}.log").read_text(errors="replace")[-2000:]
                service_unavailable("Redis topology", f"127.0.0.1:{port}", f"{exc}; log:\n{log}")

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
        os.killpg(self.procs[replica].pid, signal.SIGSTOP)
        client = quick_redis(f"redis://127.0.0.1:{master}/0")
        try:
            client.execute_command("CLIENT", "KILL", "TYPE", "replica")
        finally:
            client.close()

    def resume(self, port: int) -> None:
        """SIGCONT: a stopped server runs on."""
        os.killpg(self.procs[port].pid, signal.SIGCONT)

    def kill9(self, port: int) -> None:
        """SIGKILL: no shutdown, nothing saved, writes not yet sent to a replica are lost."""
        proc = self.procs[port]
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def stop(self) -> None:
        for port, proc in self.procs.items():
            if proc.poll() is None:
                self.resume(port)  # a stopped process dies of SIGKILL too; be plain about it
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)


class ReplicatedCluster(_Servers):
    """3 masters + 3 replicas on free loopback ports (each port P and its bus port P + 10000)."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.ports: list[int] = []

    def start(self) -> ReplicatedCluster:
        while len(self.ports) < 6:
            port = free_cluster_port()
            if port not in self.ports:
                self.ports.append(port)
        for port in self.ports:
            self.spawn(port, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                       "--cluster-node-timeout", str(NODE_TIMEOUT_MS))
        self.wait_up(self.ports)
        done = run_quietly([self.cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                            "--cluster-replicas", "1", "--cluster-yes"], timeout=60)
        if done.returncode != 0:
            service_unavailable("Redis Cluster", "127.0.0.1",
                                f"redis-cli --cluster create failed:\n{done.stdout}\n{done.stderr}")
        # `create` returns once the slots are assigned; the replicas still have to sync.
        _wait(lambda: all(cluster_ok(p) for p in self.ports)
              and len(self.masters()) == 3 and all(
                  self.info(p, "replication").get("master_link_status") == "up"
                  for p in self.ports if p not in self.masters()),
              45, "the cluster reports ok with 3 masters and 3 synced replicas")
        return self

    @property
    def url(self) -> str:
        """Every node, as ``flowcontrol_backend_url``."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def client(self) -> redis.cluster.RedisCluster:
        from redis.cluster import ClusterNode, RedisCluster

        alive = [p for p in self.ports if self.procs[p].poll() is None]
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in alive])

    def slots(self) -> list[tuple[int, int, int]]:
        """(first slot, last slot, master port) of every range, as a live node sees it."""
        for port in self.ports:
            if self.procs[port].poll() is not None:
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
        port = next(p for p in self.ports if self.procs[p].poll() is None)
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
        _wait(promoted, timeout, f"a replica of {dead} takes over its slots")
        return self.master_of(key)


class SentinelGroup(_Servers):
    """A master, its replica and three Sentinels (quorum 2) on free loopback ports."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.master = self.replica = 0
        self.sentinels: list[int] = []

    def start(self) -> SentinelGroup:
        from tests.support.services import free_port

        self.master, self.replica = free_port(), free_port()
        self.spawn(self.master)
        self.spawn(self.replica, "--replicaof", "127.0.0.1", str(self.master))
        self.wait_up([self.master, self.replica])
        _wait(lambda: self.info(self.replica, "replication").get("master_link_status") == "up",
              20, "the replica syncs")
        for _ in range(3):
            port = free_port()
            conf = self.workdir / f"sentinel-{port}.conf"  # a Sentinel rewrites its own config
            conf.write_text(
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} 5000\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n")
            self.spawn(port, "--sentinel", conf=str(conf))
            self.sentinels.append(port)
        self.wait_up(self.sentinels)
        # Each Sentinel must know the replica and the others before a failover can be voted.
        _wait(lambda: all(self._sentinel(p, "SENTINEL", "MASTER", MASTER_NAME) >= (1, 2)
                          for p in self.sentinels), 30, "the Sentinels see the replica and each other")
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
        _wait(lambda: self.current_master() != dead and
              self.info(self.current_master(), "replication")["role"] == "master",
              timeout, f"the Sentinels promote a replica of {dead}")
        return self.current_master()
