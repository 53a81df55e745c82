"""Real ``celery worker`` subprocesses for the e2e tests and the benchmarks.

A :class:`Harness` owns one test's world: a tmp dir holding ``proj.py`` (the app of
:mod:`tests.support.projects.base`), the environment that configures it, a client app to send tasks, the
:class:`~tests.support.gauge.Gauge` the tasks measure themselves with, and the worker and beat
processes. Each process runs in its own session (process group), logs to a file in the tmp dir,
and is stopped at teardown with SIGTERM (Celery's warm shutdown), then SIGKILL of its whole group
after a bound. :meth:`Harness.kill9` is the crash: SIGKILL of a node's main process and pool children.

Everything one test touches is named after its unique prefix: the broker queue, kombu's Redis
keys (``global_keyprefix``), the flowcontrol key prefix and the gauge, so tests never see each
other's messages or counters.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import redis
from celery import Celery

from tests.support.gauge import Execution, Gauge
from tests.support.waiting import wait_for

__all__ = ["REPO", "Harness", "Node", "max_in_window", "max_overlap", "mean_in_flight", "wait_for"]

REPO = Path(__file__).resolve().parents[2]
#: ``proj.py`` of a test's dir: the app of the harness's ``project`` module, built from the env.
PROJ = "import os\n\nfrom {module} import create_app\n\napp = create_app(os.environ)\n"
READY = "ready."
BEAT_READY = "beat: Starting..."


@dataclass
class Node:
    """One ``celery worker`` (or ``celery beat``) subprocess and its log files."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    out: Path
    kind: str = "worker"

    def alive(self) -> bool:
        """True while the main process runs."""
        return self.proc.poll() is None

    def text(self) -> str:
        """The node's log file, then whatever it wrote to stdout/stderr."""
        parts = []
        for path in (self.log, self.out):
            if path.exists():
                parts.append(path.read_text(errors="replace"))
        return "\n".join(parts)


@dataclass
class Harness:
    """One test's project dir, environment, client app, gauge and processes.

    A subclass runs another project module (one with ``create_app(env)``) by naming it in
    ``project``; workers and the client app both use it."""

    project: ClassVar[str] = "tests.support.projects.base"

    workdir: Path
    broker_url: str
    gauge_url: str
    prefix: str
    conf: dict[str, Any] = field(default_factory=dict)
    flow: bool = True
    result_backend: str | None = None
    nodes: list[Node] = field(default_factory=list)
    #: The workers count the runs admission let in (``gauge.gated()``), for the ``gated`` marker.
    witness: bool = False

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "proj.py").write_text(PROJ.format(module=self.project))
        self.gauge = Gauge(self.gauge_url, self.prefix)
        self._app: Celery | None = None
        self._serial = 0

    # -- configuration -------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        """The variables that configure ``proj.py`` (see :mod:`tests.support.projects.base`)."""
        env = {
            "FCT_BROKER_URL": self.broker_url,
            "FCT_PREFIX": self.prefix,
            "FCT_GAUGE_URL": self.gauge_url,
            "FCT_FLOW": "1" if self.flow else "0",
            "FCT_CONF": json.dumps(self.conf),
        }
        if self.result_backend:
            env["FCT_RESULT_BACKEND"] = self.result_backend
        if self.witness:
            env["FCT_WITNESS"] = "1"
        return env

    @property
    def app(self) -> Celery:
        """The client app: the same tasks and settings as the workers', for sending."""
        if self._app is None:
            self._app = importlib.import_module(self.project).create_app(self.env)
        return self._app

    @property
    def queue_name(self) -> str:
        """The broker queue every task of this test goes through."""
        return f"{self.prefix}.tasks"

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, kind: str, name: str, args: list[str], env: Mapping[str, str] | None) -> Node:
        log, out = self.workdir / f"{name}.log", self.workdir / f"{name}.out"
        full_env = {**os.environ, **self.env, "FCT_NODE": name, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join([str(self.workdir), str(REPO)])
        # Celery's command, without the interpreter's final sweep after it exits (celery_command.py)
        command = [sys.executable, "-m", "tests.support.celery_command", "-A", "proj", kind, f"--logfile={log}", *args]
        with out.open("wb") as sink:
            proc = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments
                command,
                cwd=self.workdir,
                env=full_env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        node = Node(name, proc, log, out, kind)
        self.nodes.append(node)
        return node

    def start_worker(
        self,
        concurrency: int = 4,
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        wait: bool = True,
        loglevel: str = "INFO",
        extra: Iterable[str] = (),
    ) -> Node:
        """Start ``celery -A proj worker -P prefork -c <concurrency>`` and wait until it is ready."""
        self._serial += 1
        name = name or f"w{self._serial}"
        args = [
            "worker",
            "-P",
            "prefork",
            "-c",
            str(concurrency),
            "-n",
            f"{self.prefix}-{name}@%h",
            f"--loglevel={loglevel}",
            "--without-gossip",
            "--without-mingle",
            "-Q",
            self.queue_name,
            *extra,
        ]
        node = self._spawn("worker", name, args[1:], env)
        if wait:
            self.wait_ready(node)
        return node

    def start_beat(self, name: str = "beat") -> Node:
        """Start ``celery -A proj beat`` (schedule file in the tmp dir) and wait until it runs."""
        args = ["--loglevel=INFO", f"--schedule={self.workdir / 'beat-schedule'}", "--pidfile="]
        node = self._spawn("beat", name, args, None)
        wait_for(lambda: BEAT_READY in node.text() or not node.alive(), 30, what=f"{name} to start")
        if not node.alive():
            raise AssertionError(f"{name} exited with {node.proc.returncode}:\n{node.text()[-3000:]}")
        return node

    def wait_ready(self, node: Node, timeout: float = 45) -> None:
        """Wait for the worker's ``ready.`` log line; fail with its log if it dies first."""
        wait_for(lambda: READY in node.text() or not node.alive(), timeout, 0.1, f"{node.name} to be ready")
        if not node.alive():
            raise AssertionError(f"{node.name} exited with {node.proc.returncode}:\n{node.text()[-4000:]}")

    def stop(self, node: Node, timeout: float = 20) -> None:
        """Warm shutdown (SIGTERM); SIGKILL of the node's process group after ``timeout``."""
        if node.alive():
            node.proc.send_signal(signal.SIGTERM)
            try:
                node.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self._kill_group(node)

    def kill9(self, node: Node) -> None:
        """The crash: SIGKILL of the main process and every pool child at once."""
        self._kill_group(node)

    def _kill_group(self, node: Node) -> None:
        try:
            os.killpg(node.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            node.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self, timeout: float = 20) -> None:
        """Stop every process this harness started: the workers side by side (SIGTERM to each,
        then each waited for, SIGKILL of its group after ``timeout``, as :meth:`stop`), then beat."""
        for beat in (False, True):
            nodes = [n for n in self.nodes if (n.kind == "beat") == beat]
            for node in nodes:
                if node.alive():
                    node.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for node in nodes:
                try:
                    node.proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
                self._kill_group(node)

    def logs(self, tail: int = 6000) -> str:
        """The tail of every node's log, for a failure report."""
        return "\n".join(
            f"===== {n.kind} {n.name} (rc={n.proc.returncode}) =====\n{n.text()[-tail:]}" for n in self.nodes
        )

    def log_text(self) -> str:
        """Every node's full log."""
        return "\n".join(n.text() for n in self.nodes)

    # -- sending and waiting --------------------------------------------------------------------

    def send(self, task: str, *args: Any, **options: Any) -> str:
        """``apply_async`` of ``proj.<task>`` on the client app; returns the task id."""
        return str(self.app.tasks[f"proj.{task}"].apply_async(args, **options).id)

    def wait_done(self, labels: Iterable[str], timeout: float) -> dict[str, int]:
        """Wait until every label has finished at least once; the done counts."""
        wanted = set(labels)

        def complete() -> bool:
            return wanted <= set(self.gauge.done())

        try:
            wait_for(complete, timeout, 0.2, f"{len(wanted)} tasks to finish")
        except AssertionError as exc:
            missing = sorted(wanted - set(self.gauge.done()))
            raise AssertionError(f"{exc}; {len(missing)} never finished, e.g. {missing[:5]}") from None
        return self.gauge.done()

    def in_broker(self, task_id: str) -> bool:
        """True while a message of ``task_id`` is ready or delivered-but-unacked (Redis broker only)."""
        client = redis.Redis.from_url(self.broker_url)
        try:
            # One list per priority step (kombu's ``<queue>\x06\x16<n>``): a priority= puts a message there.
            ready = [
                raw
                for name in [self.queue_name, *(f"{self.queue_name}\x06\x16{n}" for n in range(1, 10))]
                for raw in client.lrange(f"{self.prefix}:{name}", 0, -1)
            ]
            unacked = client.hvals(f"{self.prefix}:unacked")
            return any(task_id.encode() in raw for raw in [*ready, *unacked])
        finally:
            client.close()

    def ready(self) -> int:
        """How many messages of the test's broker queue wait in the broker, delivered to no
        worker yet (Redis: its lists, one per priority step; RabbitMQ: the queue's ready count)."""
        if self.broker_url.startswith("amqp"):
            with self.app.pool.acquire(block=True) as conn:
                declared = conn.default_channel.queue_declare(self.queue_name, passive=True)
                return int(declared.message_count)
        client = redis.Redis.from_url(self.broker_url)
        try:
            names = [self.queue_name, *(f"{self.queue_name}\x06\x16{n}" for n in range(1, 10))]
            return sum(int(client.llen(f"{self.prefix}:{name}")) for name in names)
        finally:
            client.close()

    def listed(self, key: str) -> list[str]:
        """A list the project's tasks recorded into under the test's prefix (``runs``,
        ``slots``...)."""
        client = redis.Redis.from_url(self.gauge_url)
        try:
            return [v.decode() for v in client.lrange(f"{self.prefix}:{key}", 0, -1)]
        finally:
            client.close()

    def parked(self, queue: str | None = None) -> int:
        """How many messages the parking table holds (in ``queue``)."""
        return self.store().count(queue)

    def store(self) -> Any:
        """A :class:`ParkingStore` on the test's parking database."""
        from celery_flowcontrol.parking import ParkingStore

        if not hasattr(self, "_store"):
            self._store = ParkingStore(self.conf["flowcontrol_parking_url"])
        return self._store

    # -- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the processes, close clients, delete the test's broker queue and Redis keys."""
        self.gauge.open_gate()  # a gate task still waiting would hold up the warm shutdown
        self.stop_all()
        if hasattr(self, "_store"):
            self._store.close()
        if self._app is not None:
            if self.broker_url.startswith("amqp"):
                try:
                    with self._app.connection_for_write() as conn:
                        conn.default_channel.queue_delete(self.queue_name)
                except Exception:  # noqa: BLE001 - best effort cleanup of a throwaway queue
                    pass
            self._app.close()
        self.gauge.close()
        client = redis.Redis.from_url(self.gauge_url)
        try:
            keys = list(client.scan_iter(match=f"*{self.prefix}*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
        finally:
            client.close()


# -- measurements ------------------------------------------------------------------------------


def max_overlap(runs: Iterable[Execution], cut: float | None = None) -> int:
    """The most executions running at once, from their intervals (an open one ends at ``cut``)."""
    events: list[tuple[float, int]] = []
    for run in runs:
        end = run.end if run.end is not None else cut
        if end is None:
            end = float("inf")
        events.append((run.start, 1))
        events.append((end, -1))
    events.sort(key=lambda e: (e[0], e[1]))  # an end at t comes before a start at t
    peak = now = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


def max_in_window(times: Iterable[float], width: float) -> tuple[int, float]:
    """The most instants inside any half-open span ``[t, t + width)``, and where it starts."""
    ts = sorted(times)
    best, where, j = 0, ts[0] if ts else 0.0, 0
    for i, t in enumerate(ts):
        while ts[j] <= t - width:
            j += 1
        if i - j + 1 > best:
            best, where = i - j + 1, ts[j]
    return best, where


def mean_in_flight(runs: list[Execution]) -> tuple[float, float]:
    """(mean executions in flight between the first start and the last end, that span)."""
    closed = [r for r in runs if r.end is not None]
    if not closed:
        return 0.0, 0.0
    first, last = min(r.start for r in closed), max(r.end for r in closed if r.end is not None)
    busy = sum((r.end or 0.0) - r.start for r in closed)
    span = last - first
    return (busy / span if span > 0 else 0.0), span
