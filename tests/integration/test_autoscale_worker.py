"""AdaptiveAutoscaler in real ``celery worker`` processes (prefork, gevent, eventlet, threads, solo) on Redis.

The tasks count themselves in Redis (running now, and the most ever running at once), so the cap
is measured by the tasks, not by the autoscaler's own figures.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

ROOT = Path(__file__).resolve().parents[2]

APP = textwrap.dedent(
    """
    import json, os, time
    import redis
    from celery import Celery
    import celery_flowcontrol.worker.control  # noqa: F401

    app = Celery("fcauto", broker=os.environ["T_BROKER"])
    app.conf.update(
        task_default_queue=os.environ["T_QUEUE"], task_acks_late=True, worker_prefetch_multiplier=1,
        task_ignore_result=True, broker_connection_retry_on_startup=True,
        worker_autoscaler="celery_flowcontrol.autoscale:AdaptiveAutoscaler",
        flowcontrol_autoscale=json.loads(os.environ["T_AUTOSCALE"]),
    )
    r = redis.Redis.from_url(os.environ["T_BROKER"])
    KEY = os.environ["T_QUEUE"] + ":running"
    COUNT = "local n = redis.call('INCR', KEYS[1]) " \\
            "if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end return n"

    @app.task(name="t.work")
    def work(seconds=0.05):
        r.eval(COUNT, 2, KEY, KEY + ":max")
        try:
            time.sleep(seconds)
        finally:
            r.decr(KEY)
    """
)


class Worker:
    """A ``celery worker`` subprocess on its own queue, with its log and its events."""

    def __init__(self, tmp: Path, broker: str, queue: str, args: list[str], autoscale: dict[str, Any]) -> None:
        (tmp / "fcauto.py").write_text(APP)
        self.node = f"{queue}@test"
        self.logfile = tmp / "worker.log"
        env = {**os.environ, "T_BROKER": broker, "T_QUEUE": queue, "T_AUTOSCALE": json.dumps(autoscale)}
        env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(ROOT), env.get("PYTHONPATH", "")])
        cmd = [
            sys.executable,
            "-m",
            "tests.support.celery_command",  # Celery's command, no final sweep after it exits
            "-A",
            "fcauto",
            "worker",
            "-n",
            self.node,
            "-l",
            "info",
            "--without-mingle",
            "--without-gossip",
            *args,
        ]
        with open(self.logfile, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.logfile.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_for(check: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    return check()


@pytest.fixture
def client_app(redis_url: str) -> Celery:
    app = Celery("fcauto-client", broker=redis_url)
    app.conf.broker_connection_retry_on_startup = True
    return app


@pytest.fixture
def start_worker(
    tmp_path: Path, redis_url: str, key_prefix: str, redis_client: redis.Redis, client_app: Celery
) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def start(args: list[str], autoscale: dict[str, Any] | None = None, ready: bool = True) -> Worker:
        worker = Worker(tmp_path, redis_url, key_prefix, args, {"tick": 0.5, **(autoscale or {})})
        workers.append(worker)
        if ready:
            up = wait_for(lambda: worker.proc.poll() is not None or client_app.control.ping([worker.node], 0.5), 30)
            assert worker.proc.poll() is None and up, worker.log()[-3000:]
        return worker

    yield start
    for worker in workers:
        worker.stop()
    redis_client.delete(key_prefix)


def backlog(app: Celery, queue: str, n: int, seconds: float = 0.05) -> None:
    with app.producer_or_acquire() as producer:
        for _ in range(n):
            app.send_task("t.work", (seconds,), queue=queue, producer=producer)


def stats(app: Celery, worker: Worker, command: str) -> dict[str, Any]:
    replies = app.control.inspect(destination=[worker.node], timeout=2.0)._request(command) or {}
    return replies.get(worker.node) or {}


def test_prefork_grows_reports_and_sends_events(
    start_worker: Callable[..., Worker], client_app: Celery, key_prefix: str
) -> None:
    events: list[dict[str, Any]] = []
    receivers: list[Any] = []

    def listen() -> None:
        with client_app.connection_for_read() as conn:
            recv = client_app.events.Receiver(conn, handlers={"worker-flowcontrol": events.append})
            receivers.append(recv)
            recv.capture(limit=None, timeout=None, wakeup=False)

    threading.Thread(target=listen, daemon=True).start()
    worker = start_worker(["-P", "prefork", "--autoscale=6,1"])
    backlog(client_app, key_prefix, 600)
    try:
        grown = wait_for(
            lambda: (stats(client_app, worker, "flowcontrol_stats").get("autoscaler") or {}).get("limit", 0) >= 3, 30
        )
        assert grown, worker.log()[-3000:]
        # p50 is the last tick's: None after a tick in which nothing finished (a busy machine
        # can stall the pool for a tick), so read the figures of a tick that saw tasks finish.
        figures = wait_for(
            lambda: (lambda f: f if f.get("p50_ms") is not None else None)(
                stats(client_app, worker, "flowcontrol_stats").get("autoscaler") or {}
            ),
            10,
        )
        assert figures, stats(client_app, worker, "flowcontrol_stats")
        assert figures["enabled"] and figures["completed"] > 0 and figures["p50_ms"] >= 45
        assert figures["last_adjustment"]["reason"] and figures["rss_bytes"] > 0
        assert figures["overhead_pct"] < 5
        under_stats = stats(client_app, worker, "stats")["autoscaler"]
        assert {"max", "min", "current", "qty", "limit", "inflight", "p95_ms"} <= set(under_stats)
        assert wait_for(lambda: [e for e in events if e.get("hostname") == worker.node], 10)
    finally:
        for recv in receivers:
            recv.should_stop = True
    assert "WorkerLostError" not in worker.log()


def test_a_cut_holds_where_tasks_are_admitted_and_kills_no_busy_child(
    start_worker: Callable[..., Worker], client_app: Celery, key_prefix: str, redis_client: redis.Redis
) -> None:
    # min 6 until the cut: the pool is full when the cut comes, not shrunk already because a
    # busy machine fed it too slowly to keep six children busy (the "idle" rule); 0.5 s tasks
    # keep five of them busy at a few messages a second.
    worker = start_worker(["-P", "prefork", "--autoscale=6,6"], {"start": 6, "min": 6, "max": 6})
    backlog(client_app, key_prefix, 200, seconds=0.5)
    assert wait_for(lambda: int(redis_client.get(key_prefix + ":running:max") or 0) >= 5, 20), worker.log()[-3000:]
    # The `autoscale` remote command: new bounds, applied at once, while every child is busy.
    client_app.control.autoscale(2, 1, destination=[worker.node], reply=True, timeout=2)
    time.sleep(1.5)  # tasks already running finish (0.5 s); no new ones beyond the limit
    redis_client.set(key_prefix + ":running:max", 0)
    time.sleep(3.0)
    assert int(redis_client.get(key_prefix + ":running:max") or 0) <= 2
    figures = wait_for(
        lambda: (lambda f: f if f.get("processes") == 2 else None)(
            stats(client_app, worker, "flowcontrol_stats").get("autoscaler") or {}
        ),
        10,
    )
    assert figures, stats(client_app, worker, "flowcontrol_stats")
    assert "WorkerLostError" not in worker.log()


def test_threads_pool_says_so_and_stays_off(start_worker: Callable[..., Worker], client_app: Celery) -> None:
    worker = start_worker(["-P", "threads", "--autoscale=4,2"])
    figures = stats(client_app, worker, "flowcontrol_stats")["autoscaler"]
    assert figures["enabled"] is False
    assert "can't resize" in worker.log() and "autoscaling stays off" in worker.log()


def test_bad_settings_stop_the_worker_with_the_field_named(start_worker: Callable[..., Worker]) -> None:
    worker = start_worker(["-P", "prefork", "--autoscale=4,1"], {"ram_ceiling_pct": 150}, ready=False)
    assert worker.proc.wait(30) != 0
    assert "flowcontrol_autoscale.ram_ceiling_pct" in worker.log() and "FlowControlConfigError" in worker.log()


def listen_for_events(app: Celery, into: list[dict[str, Any]]) -> list[Any]:
    """Collect ``worker-flowcontrol`` events in a daemon thread; returns the receivers to stop."""
    receivers: list[Any] = []

    def listen() -> None:
        with app.connection_for_read() as conn:
            recv = app.events.Receiver(conn, handlers={"worker-flowcontrol": into.append})
            receivers.append(recv)
            recv.capture(limit=None, timeout=None, wakeup=False)

    threading.Thread(target=listen, daemon=True).start()
    return receivers


@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_green_pools_scale_for_real(
    start_worker: Callable[..., Worker], client_app: Celery, key_prefix: str, redis_client: redis.Redis, pool: str
) -> None:
    """gevent and eventlet: the controller ticks, and its limit is what the pool runs at once.

    Measured by the tasks: from a start of 1 the pool grows past 3 tasks at once, and after the
    ``autoscale`` remote command cuts it to 2, no more than 2 run at once.
    """
    importlib.import_module(pool)  # in the test extra: a missing one fails the run, never skips it
    events: list[dict[str, Any]] = []
    receivers = listen_for_events(client_app, events)
    worker = start_worker(["-P", pool, "--autoscale=8,1"])
    running_max = key_prefix + ":running:max"
    try:
        backlog(client_app, key_prefix, 3000)
        figures = wait_for(
            lambda: (lambda f: f if f.get("limit", 0) >= 4 else None)(
                stats(client_app, worker, "flowcontrol_stats").get("autoscaler") or {}
            ),
            40,
        )
        assert figures, worker.log()[-3000:]
        assert figures["enabled"] and figures["processes"] == figures["limit"]
        assert figures["completed"] > 0 and figures["p50_ms"] >= 45
        assert figures["last_adjustment"]["reason"]
        assert int(redis_client.get(running_max) or 0) >= 3, "the pool never ran more than 2 tasks at once"
        # The pool's own figure moved with the limit (gevent/eventlet report their size here).
        pool_info = stats(client_app, worker, "stats")["pool"]
        assert pool_info["max-concurrency"] >= 3, pool_info
        ours = wait_for(lambda: [e for e in events if e.get("hostname") == worker.node], 10)
        assert ours and "p95_ms" in ours[-1]
        assert any((e["last_adjustment"] or {}).get("reason", "").startswith("probe") for e in ours), ours[-1]

        client_app.control.autoscale(2, 1, destination=[worker.node], reply=True, timeout=2)
        time.sleep(1.0)  # tasks already running finish (50 ms)
        redis_client.set(running_max, 0)
        time.sleep(3.0)
        assert 1 <= int(redis_client.get(running_max) or 0) <= 2, worker.log()[-3000:]
        after = stats(client_app, worker, "flowcontrol_stats")["autoscaler"]
        assert after["limit"] <= 2 and after["processes"] == after["limit"], after
    finally:
        for recv in receivers:
            recv.should_stop = True
    worker.stop()
    assert "Traceback" not in worker.log(), worker.log()[-3000:]


def test_solo_pool_says_so_and_stays_off(start_worker: Callable[..., Worker], client_app: Celery) -> None:
    worker = start_worker(["-P", "solo", "--autoscale=4,2"])
    figures = stats(client_app, worker, "flowcontrol_stats")["autoscaler"]
    assert figures["enabled"] is False
    assert "the solo pool can't resize" in worker.log() and "autoscaling stays off" in worker.log()
