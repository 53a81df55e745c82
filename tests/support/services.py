"""Throwaway services the chaos scenarios may break: a Redis server, a PostgreSQL cluster, a
RabbitMQ node and a TCP proxy, each on its own free loopback port, owned by one test and gone
after it.

The shared services of the machine (Redis 6379, PostgreSQL 5432, RabbitMQ 5672) are used by
other test runs at the same time; stopping them would break those runs, so every fault is
injected into one of these instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis

from tests.conftest import redis_answers

PG_BIN = Path("/usr/lib/postgresql") / (sorted(os.listdir("/usr/lib/postgresql"))[-1]
                                        if Path("/usr/lib/postgresql").is_dir() else "0") / "bin"


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not come up within {timeout:g} s")
        time.sleep(0.05)


class RedisServer:
    """``redis-server`` on a free port with no persistence: a restart loses every key."""

    def __init__(self, workdir: Path, port: int | None = None, *, persist: bool = False) -> None:
        self.workdir = workdir
        self.persist = persist  # an append-only file, fsynced per write (a broker's setting)
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        """Start (or start again, on the same port, empty)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / f"redis-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(  # noqa: S603,S607 - the distribution's binary
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes" if self.persist else "no", "--appendfsync", "always",
             "--appendfilename", f"aof-{self.port}.aof", "--appenddirname", f"aof-{self.port}",
             "--dir", str(self.workdir), "--protected-mode", "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait(self.answers, 15, f"redis-server on {self.port}")
        return self

    def answers(self) -> bool:
        """True when the server answers PING."""
        return redis_answers(self.url)

    def stop(self) -> None:
        """Kill it: without ``persist`` its data, held only in memory, is gone; with it, a
        graceful SIGTERM (what a service manager sends) and the append-only file keeps it."""
        if self.proc is not None and self.proc.poll() is None:
            if self.persist:
                self.proc.terminate()
            else:
                self.proc.kill()
            self.proc.wait(20)

    def restart(self, down_for: float = 0.0) -> None:
        """Stop, stay down ``down_for`` seconds, start again empty."""
        self.stop()
        time.sleep(down_for)
        self.start()

    def client(self) -> redis.Redis:
        """A client of this server."""
        return redis.Redis(port=self.port)


class Postgres:
    """A PostgreSQL cluster of its own (``initdb`` + ``pg_ctl`` as the postgres user, trust
    auth, data under ``workdir``), so stopping it disturbs nobody else."""

    def __init__(self) -> None:
        self.port = free_port()
        # Not under pytest's tmp dir: that one is private to root (0700), and the server runs
        # as the postgres user.
        self.data = Path(tempfile.mkdtemp(prefix="fc-chaos-pg-")) / "pgdata"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *args: str, timeout: float = 60) -> None:
        command = [str(PG_BIN / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")

    def start(self) -> Postgres:
        """initdb (first time) and start; waits until it accepts connections."""
        if not (self.data / "PG_VERSION").exists():
            self.data.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(self.data.parent, "postgres")
                shutil.chown(self.data, "postgres")
            self._as_postgres("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres",
                              "--no-sync", "-E", "UTF8")
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} -c fsync=off " \
               "-c max_connections=60 -c shared_buffers=16MB"
        self._as_postgres("pg_ctl", "-D", str(self.data), "-o", opts, "-l",
                          str(self.data / "server.log"), "-w", "-t", "30", "start")
        return self

    def stop(self) -> None:
        """Fast shutdown: open connections are cut."""
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")

    def destroy(self) -> None:
        """Stop (if running) and delete the data directory."""
        try:
            self.stop()
        except AssertionError:
            pass
        shutil.rmtree(self.data.parent, ignore_errors=True)


class RabbitServer:
    """A RabbitMQ node of its own: ``fc<port>@localhost`` on a free AMQP port and a free
    distribution port, with its mnesia database, logs, config, plugins file and Erlang cookie
    (``HOME``) under ``workdir``; no plugins. epmd (4369) is shared with the machine's node,
    which is harmless: it only maps node names to ports.

    A restart keeps the mnesia directory and the ports, so durable queues and persistent
    messages survive it, as on a production node with its disk.
    """

    RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"fc{self.port}@localhost"
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.proc: subprocess.Popen[bytes] | None = None

    def _env(self) -> dict[str, str]:
        w = self.workdir
        return {**os.environ, "HOME": str(w / "home"), "RABBITMQ_NODENAME": self.node,
                "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_MNESIA_BASE": str(w / "mnesia"), "RABBITMQ_LOG_BASE": str(w / "log"),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(w / "enabled_plugins"),
                # Its own config and env files: the machine's listen on 5672 (its node's port).
                "RABBITMQ_CONFIG_FILE": str(w / "rabbitmq.conf"),
                "RABBITMQ_CONF_ENV_FILE": str(w / "rabbitmq-env.conf"),
                "RABBITMQ_PID_FILE": str(w / "node.pid"), "ERL_EPMD_ADDRESS": "127.0.0.1",
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS":
                    "-kernel inet_dist_use_interface {127,0,0,1}"}

    def start(self, timeout: float = 60) -> RabbitServer:
        """Start (or start again, on the same ports and database); waits for the AMQP port."""
        w = self.workdir
        for d in ("home", "mnesia", "log"):
            (w / d).mkdir(parents=True, exist_ok=True)
        (w / "enabled_plugins").write_text("[].\n")
        (w / "rabbitmq-env.conf").write_text("")
        (w / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n"
                                         "loopback_users = none\n")
        log = (w / "server.out").open("ab")
        self.proc = subprocess.Popen(  # noqa: S603 - the distribution's script
            [str(self.RABBIT_BIN / "rabbitmq-server")], env=self._env(), cwd=w, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        _wait(self.answers, timeout, f"rabbitmq node {self.node} on {self.port}")
        return self

    def answers(self) -> bool:
        """True when the AMQP port accepts a connection."""
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"rabbitmq node {self.node} exited: see {self.workdir}/server.out")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.3).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        """A graceful stop (``rabbitmqctl stop``, what a service manager does): queues and
        persistent messages are on disk; killed if it does not end within 30 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        subprocess.run([str(self.RABBIT_BIN / "rabbitmqctl"), "-n", self.node, "stop"],  # noqa: S603
                       env=self._env(), cwd=self.workdir, capture_output=True, timeout=40,
                       check=False)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)

    def restart(self, down_for: float = 0.0) -> None:
        """Stop, stay down ``down_for`` seconds, start again with the same database."""
        self.stop()
        time.sleep(down_for)
        self.start()

    def destroy(self) -> None:
        """Stop it and make sure no process of its session is left."""
        try:
            self.stop()
        finally:
            if self.proc is not None and self.proc.poll() is None:
                os.killpg(self.proc.pid, 9)


class TcpProxy(threading.Thread):
    """A loopback TCP proxy in front of one port. :meth:`cut` is packet loss: nothing is
    forwarded either way and new connections hang, but no connection is reset (TCP would
    keep retransmitting); :meth:`heal` delivers what was held and forwards again."""

    def __init__(self, target_port: int) -> None:
        super().__init__(daemon=True)
        self.target = target_port
        self.port = free_port()
        self.up = True
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        self._stopped = False
        self._socks: list[socket.socket] = []

    @property
    def url(self) -> str:
        """A Redis URL through the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def run(self) -> None:
        while not self._stopped:
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _hold(self) -> None:
        while not self.up and not self._stopped:
            time.sleep(0.02)

    def _connect(self, client: socket.socket) -> None:
        self._hold()  # a SYN during the loss is answered only once the network is back
        try:
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        self._socks += [client, upstream]
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                self._hold()
                data = src.recv(65536)
                if not data:
                    break
                self._hold()  # bytes sent into the loss arrive after it, as retransmits would
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def cut(self) -> None:
        """Lose every packet from now on (both directions)."""
        self.up = False

    def heal(self) -> None:
        """The network is back."""
        self.up = True

    def close(self) -> None:
        """Stop accepting and drop every connection."""
        self._stopped = True
        self.up = True
        self._server.close()
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass
