"""Every verb once as a real ``celery -A proj flowcontrol ...`` subprocess, against a real
prefork worker (with the adaptive autoscaler), a real Redis backend and the SQLite parking table.

The project and the worker come from the e2e harness (tests/support/harness.py); the command runs in
the project's directory with the same environment, as an operator's shell would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import REPO, Harness, wait_for
from tests.support.services import free_port

AUTOSCALER = "celery_flowcontrol.autoscale:AdaptiveAutoscaler"


@pytest.fixture
def harness(tmp_path: Path, redis_url: str, key_prefix: str) -> Iterator[Harness]:
    h = Harness(workdir=tmp_path / "proj", broker_url=redis_url, gauge_url=redis_url, prefix=key_prefix,
                conf={"flowcontrol_backend_url": redis_url,
                      "flowcontrol_parking_url": f"sqlite:///{tmp_path / 'park.sqlite3'}",
                      "flowcontrol_poll_interval": 0.2,
                      "flowcontrol_queues": [{"name": "api", "concurrency": 1}],
                      "worker_autoscaler": AUTOSCALER,
                      # No node dies here: a gate task held while the verbs run (a subprocess
                      # each, longer than the harness's 20 s on a busy machine) must not come
                      # back from the broker as a copy that waits in the pool, ahead of b.
                      "broker_transport_options": {"visibility_timeout": 600}})
    try:
        yield h
    finally:
        h.close()


@contextmanager
def logs_on_failure(h: Harness) -> Iterator[None]:
    """Print the worker's log and the gauge when the block fails (pytest shows it)."""
    try:
        yield
    except BaseException:
        print(h.logs(), "\nruns:", h.gauge.runs(), "done:", h.gauge.done())
        raise


def env_of(h: Harness) -> dict[str, str]:
    env = {**os.environ, **h.env}
    env["PYTHONPATH"] = os.pathsep.join([str(h.workdir), str(REPO)])
    return env


def celery(h: Harness, *args: str) -> subprocess.CompletedProcess[str]:
    """``celery -A proj flowcontrol <args>`` in the project's directory."""
    return subprocess.run(  # noqa: S603 - our interpreter, our arguments
        [sys.executable, "-m", "tests.support.celery_command", "-A", "proj", "flowcontrol", *args],
        cwd=h.workdir, env=env_of(h), capture_output=True, text=True, timeout=60, check=False)


def ok(h: Harness, *args: str) -> Any:
    result = celery(h, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def fails(h: Harness, *args: str) -> str:
    result = celery(h, *args)
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def test_every_verb_as_a_celery_subcommand(harness: Harness) -> None:
    h = harness
    with logs_on_failure(h):
        h.start_worker(2, extra=["--autoscale=3,2"])  # at least 2 pool processes: a and b run at once
        h.send("gate", "a", flow_queue="api")
        wait_for(lambda: h.gauge.started() == 1, 20, what="a to start")
        h.send("gate", "b", flow_queue="api")
        wait_for(lambda: h.parked("api") == 1, 20, what="b to be parked")

        [api] = ok(h, "list")
        assert (api["name"], api["in_use"], api["capacity"], api["waiting"], api["parked"]) == ("api", 1, 1, 1, 1)
        human = celery(h, "list")
        assert human.returncode == 0 and human.stdout.splitlines()[2].split()[:5] == ["api", "1/1", "0", "1", "1"]

        slots = ok(h, "slots", "api")
        [held] = slots["slots"]
        assert held["holder"].startswith(f"{h.prefix}-w1@")
        assert len(slots["waiters"]) == 1

        [parked] = ok(h, "parked", "api")
        assert parked["task_name"] == "proj.gate" and parked["reason"] == "concurrency"

        workers = ok(h, "workers", "--timeout", "2")
        [(node, figures)] = [(n, f) for n, f in workers.items() if n.startswith(h.prefix)]
        assert figures["autoscaler"]["max"] == 3 and figures["autoscaler"]["inflight"] == 1
        assert figures["admission"]["held"] == {"api": 1}
        [line] = [x for x in celery(h, "workers", "--timeout", "2").stdout.splitlines() if x.startswith(node)]
        held_now, parked_in_all = line.split()[-2:]
        assert held_now == "api:1" and int(parked_in_all) >= 1  # a's slot; b parked (each retry parks again)

        assert ok(h, "max-hold", "api", "10m")["max_hold_override"] == 600.0
        assert ok(h, "capacity", "api", "2")["capacity_override"] == 2
        wait_for(lambda: h.gauge.started() == 2, 20, what="b to run once capacity was raised")

        assert "without --yes" in fails(h, "release", held["slot_id"])
        assert ok(h, "release", held["slot_id"], "--yes") == {"queue": "api", "released": held["slot_id"]}
        assert "is not busy" in fails(h, "release", held["slot_id"], "--yes")
        assert fails(h, "slots", "nope") == "Error: flow queue 'nope': is not registered"
        assert "field 'capacity'" in fails(h, "capacity", "api", "lots")
        assert "up to date" in celery(h, "migrate").stdout
        assert ok(h, "capacity", "api", "reset")["capacity_override"] is None
        h.gauge.open_gate()
        h.wait_done(["a", "b"], timeout=30)


def test_the_dashboard_verb_serves_pages_and_metrics(harness: Harness) -> None:
    h = harness
    port = free_port()
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "celery", "-A", "proj", "flowcontrol", "dashboard", "--port", str(port)],
        cwd=h.workdir, env=env_of(h), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return proc.poll() is not None
        wait_for(up, 30, 0.2, "the dashboard to answer")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            assert b"Read-only: no token is set" in r.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert b"flowcontrol_reclaimed_total" in r.read()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    err = proc.stderr.read().decode() if proc.stderr else ""
    assert f"flowcontrol dashboard on http://127.0.0.1:{port}/ (read-only (no token set))" in err


def test_before_any_worker_booted_list_and_rate_show_the_config(harness: Harness) -> None:
    h = harness  # no worker started: nothing is registered in the backend yet
    [api] = ok(h, "list")
    assert api["name"] == "api" and api["registered"] is False and api["capacity"] == 1
    human = celery(h, "list").stdout
    assert "api (configured)" in human and "not yet registered" in human
    assert "no flow queues" not in human
    rate = celery(h, "rate", "api")
    assert rate.returncode == 0 and "api: rate limits none (from config" in rate.stdout


def test_migrate_without_an_app_or_url_refuses_in_an_empty_directory(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run(  # noqa: S603 - our interpreter, our arguments
        [sys.executable, "-m", "celery", "flowcontrol", "migrate"], cwd=empty,
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
        check=False)
    assert result.returncode == 2, result.stderr
    assert "no app and no parking URL" in result.stderr
    assert "celery -A proj flowcontrol migrate" in result.stderr
    assert list(empty.iterdir()) == []
