"""The services tests use: the machine's shared ones, and the servers a test owns.

Shared (their URLs from the environment; tests/conftest.py's fixtures hand them out):

Service      environment variable               default
Redis        FLOWCONTROL_TEST_REDIS_URL         redis://127.0.0.1:6379/0
PostgreSQL   FLOWCONTROL_TEST_POSTGRES_URL      postgresql+psycopg://postgres@127.0.0.1:5432/test
RabbitMQ     FLOWCONTROL_TEST_RABBITMQ_URL      amqp://guest:guest@127.0.0.1:5672//

A service that can't be reached fails the test under CI=true (CI must never go green by
skipping) and skips it elsewhere, saying what to run (:func:`service_unavailable`).

Owned: :class:`RedisServer` (the one way a test starts ``redis-server``: a throwaway server,
a broker with an append-only file, a cluster node, a Sentinel, TLS), :class:`Postgres` (a
cluster of its own) and :class:`RabbitServer` (a node of its own), each on free loopback
ports, in a dir of its own, gone after the test. The machine's shared servers are used by
other runs at the same time: a fault is only ever injected into one of these.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.waiting import wait_until

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


def redis_url_setting() -> str:
    """The shared Redis's URL (FLOWCONTROL_TEST_REDIS_URL or the default)."""
    return os.environ.get("FLOWCONTROL_TEST_REDIS_URL", DEFAULT_REDIS_URL)


def postgres_url_setting() -> str:
    """The shared PostgreSQL's SQLAlchemy URL (FLOWCONTROL_TEST_POSTGRES_URL or the default)."""
    return os.environ.get("FLOWCONTROL_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)


def rabbitmq_url_setting() -> str:
    """The shared RabbitMQ's URL (FLOWCONTROL_TEST_RABBITMQ_URL or the default)."""
    return os.environ.get("FLOWCONTROL_TEST_RABBITMQ_URL", DEFAULT_RABBITMQ_URL)


# -- missing services ---------------------------------------------------------------------


def in_ci() -> bool:
    """True when the run is CI's (CI=true), where an unreachable service is a failure."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def service_unavailable(service: str, url: str, detail: str) -> NoReturn:
    """Fail (under CI) or skip (elsewhere) a test whose service can't be reached."""
    message = f"{service} is not reachable at {url}: {detail}"
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing service fails the run; .ci/run starts it)", pytrace=False)
    pytest.skip(f"{message} (run `bash .ci/run`, or set the FLOWCONTROL_TEST_* URL)")


def need_dashboard_module(module: str) -> Any:
    """Import a dashboard dependency (module level); skip without it, but fail under CI
    (.ci/run installs it)."""
    try:
        return importlib.import_module(module)
    except ImportError:
        if in_ci():
            raise
        pytest.skip(f"{module} is not installed (pip install 'celery-flowcontrol[dashboard]')",
                    allow_module_level=True)


def need_binaries(service: str, *names: str) -> list[str]:
    """The paths of the named programs (``redis-server``...), or the test fails/skips."""
    found = [shutil.which(name) for name in names]
    missing = [name for name, path in zip(names, found, strict=True) if path is None]
    if missing:
        service_unavailable(service, "127.0.0.1", f"{' and '.join(missing)} needed (.ci/run installs them)")
    return [path for path in found if path is not None]


def run_quietly(command: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a service command, capturing its output for the error message if it fails."""
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603


# -- free ports ----------------------------------------------------------------------------

#: Cluster ports are drawn below the kernel's ephemeral range (32768 and up on Linux), bus
#: ports included (P + 10000), so no port :func:`free_port` hands out can ever be one of them.
CLUSTER_PORTS = range(20000, 22768)


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port(taken: set[int] | frozenset[int] = frozenset()) -> int:
    """A loopback port P, not in *taken*, such that P and its cluster bus port P + 10000 are
    both free."""
    for _ in range(200):
        port = random.choice(CLUSTER_PORTS)  # noqa: S311 - not a secret
        if port in taken:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free loopback port pair (P, P+10000) for a Redis Cluster node")


# -- Redis ---------------------------------------------------------------------------------


def quick_redis(url: str, **options: Any) -> redis.Redis:
    """A client for probes and SHUTDOWN: redis-py's default retries with backoff would add
    seconds to every check of a server that is down (and to every SHUTDOWN, which drops the link)."""
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2, retry=Retry(NoBackoff(), 0),
                                **options)


def redis_answers(url: str, **options: Any) -> bool:
    """True when a Redis server at ``url`` answers PING."""
    client = quick_redis(url, **options)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


class RedisServer:
    """``redis-server`` on a free loopback port (or *port*), in *workdir*, keeping nothing on
    disk unless *persist*; its own process group, so a kill takes nothing else with it.

    *args* are more server options (``--cluster-enabled yes`` ...); *conf* a config file read
    first (a Sentinel's); *tls* ``(cert, key, ca)`` files serve TLS only, on the port, and
    *password* asks clients for one. :attr:`url` reaches it.
    """

    def __init__(self, workdir: Path, port: int | None = None, *, persist: bool = False,
                 args: tuple[str, ...] = (), conf: Path | None = None,
                 tls: tuple[Path, Path, Path] | None = None, password: str | None = None) -> None:
        self.workdir = workdir
        self.persist = persist  # an append-only file, fsynced per write (a broker's setting)
        self.port = port or free_port()
        self.args = args
        self.conf = conf
        self.tls = tls
        self.password = password
        scheme = "rediss" if tls else "redis"
        secret = f":{password}@" if password else ""
        self.url = f"{scheme}://{secret}127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        """The server's log file."""
        return self.workdir / f"redis-{self.port}.log"

    def command(self) -> list[str]:
        """The ``redis-server`` command line."""
        (server,) = need_binaries("redis-server", "redis-server")
        head = [server] if self.conf is None else [server, str(self.conf)]
        if self.tls is None:
            listen = ["--port", str(self.port)]
        else:
            cert, key, ca = self.tls
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                      "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]
        persist = ["--appendonly", "yes", "--appendfsync", "always", "--appendfilename",
                   f"aof-{self.port}.aof", "--appenddirname", f"aof-{self.port}"] if self.persist \
            else ["--appendonly", "no"]
        password = ["--requirepass", self.password] if self.password else []
        return [*head, *listen, "--bind", "127.0.0.1", "--save", "", *persist, *password,
                "--dir", str(self.workdir), "--protected-mode", "no", *self.args]

    def spawn(self) -> RedisServer:
        """Start the process, without waiting for it to answer."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,  # noqa: S603
                                         start_new_session=True)
        return self

    def wait_up(self, timeout: float = 15) -> RedisServer:
        """Return once it answers; the test fails (CI) or skips, with the log's tail, if not."""
        if not wait_until(self.answers, timeout, 0.05):
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            service_unavailable("redis-server", f"127.0.0.1:{self.port}",
                                f"it does not answer within {timeout:g} s; log:\n{tail}")
        return self

    def start(self, timeout: float = 15) -> RedisServer:
        """Start (or start again, on the same port, empty unless *persist*) and wait for it."""
        return self.spawn().wait_up(timeout)

    def running(self) -> bool:
        """True while the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def answers(self) -> bool:
        """True when the server answers PING."""
        if self.tls is None:
            return redis_answers(self.url)
        try:  # a TLS probe needs the CA; being listening is what start waits for
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def client(self, **options: Any) -> redis.Redis:
        """A client of this server."""
        return redis.Redis.from_url(self.url, **options)

    def stop(self) -> None:
        """Kill it: without ``persist`` its data, held only in memory, is gone; with it, a
        graceful SIGTERM (what a service manager sends) and the append-only file keeps it."""
        if self.running():
            assert self.proc is not None
            self.resume()  # a stopped process does not act on SIGTERM
            if self.persist:
                self.proc.terminate()
            else:
                self.proc.kill()
            self.proc.wait(20)

    def restart(self, down_for: float = 0.0) -> None:
        """Stop, stay down ``down_for`` seconds, start again."""
        self.stop()
        time.sleep(down_for)
        self.start()

    def kill9(self) -> None:
        """SIGKILL: no shutdown, nothing saved, writes not yet sent to a replica are lost."""
        if self.running():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: it answers nothing until :meth:`resume`."""
        if self.running():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: a stopped server runs on."""
        if self.running():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGCONT)


# -- PostgreSQL ----------------------------------------------------------------------------


def libpq_url(sqlalchemy_url: str) -> str:
    """The libpq form of a SQLAlchemy PostgreSQL URL (drops the ``+driver`` part)."""
    from sqlalchemy.engine import make_url

    return make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)


def postgres_answers(url: str) -> str | None:
    """None when PostgreSQL at ``url`` accepts a query, else the error text."""
    import psycopg

    try:
        with psycopg.connect(libpq_url(url), connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return None
    except psycopg.Error as exc:
        return str(exc).strip() or type(exc).__name__


PG_BIN = Path("/usr/lib/postgresql") / (sorted(os.listdir("/usr/lib/postgresql"))[-1]
                                        if Path("/usr/lib/postgresql").is_dir() else "0") / "bin"


class Postgres:
    """A PostgreSQL cluster of its own (``initdb`` + ``pg_ctl`` as the postgres user, trust
    auth, data in a temporary dir), so stopping it disturbs nobody else."""

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
        done = run_quietly(command, timeout=timeout)
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


# -- RabbitMQ ------------------------------------------------------------------------------


def rabbitmq_answers(url: str) -> str | None:
    """None when an AMQP broker at ``url`` accepts a connection, else the error text."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        return None
    except Exception as exc:  # kombu wraps socket and AMQP errors in several classes
        return str(exc).strip() or type(exc).__name__


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
        with (w / "server.out").open("ab") as log:
            self.proc = subprocess.Popen(  # noqa: S603 - the distribution's script
                [str(self.RABBIT_BIN / "rabbitmq-server")], env=self._env(), cwd=w, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        if not wait_until(self.answers, timeout, 0.05):
            raise AssertionError(f"rabbitmq node {self.node} on {self.port} did not come up within {timeout:g} s")
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
