"""Every slot example runs as a user would run it (``python examples/<name>.py``), with the
embedded defaults (filesystem broker, memory:// admission, SQLite parking, a real worker it
starts itself), and prints the summary it promises. One also runs on Redis, and so does the
Django project (examples/django_project), as its README says to run it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CASES = {
    "voice_calls": (
        ["22"],
        r"voice_calls: 22 calls, at most (\d+) at once \(concurrency 20\), every slot released by the webhook, "
        r"a second release: released=False",
    ),
    "partner_sessions": (["6"], r"partner_sessions: 6 accounts synced, at most (\d+) sessions at once \(limit 3\)"),
    "report_export": (
        [],
        r"report_export: exported \['monthly.csv', 'yearly.csv'\], daily gave up: True \(flow queue 'exports': "
        r"no slot was granted within 0.5 s\)",
    ),
    "serial_task": (["8"], r"serial_task: 8 steps, at most (1) at once, in order: True"),
    "collapse_calls": (
        ["20"],
        r"collapse_calls: 10 sync calls ran (2) times, 20 saves reindexed 1 time\(s\) with version 19, "
        r"every result resolved: True",
    ),
    "batch_calls": (
        ["20"],
        r"batch_calls: 20 calls ran in (\d+) batches of at most \d+ \(size 8\), every call got its own "
        r"result: True, models mixed in a batch: False",
    ),
    "llm_quota": (
        ["16"],
        r"llm_quota: 16 of 16 calls done, (\d+) tokens settled, \d+ pushed back with 429 "
        r"\(each backed off and ran again\)",
    ),
    "fan_out": (
        ["300", "10"],
        r"fan_out: 300 of 300 results in order: True, at most (\d+) in flight \(concurrency 10\)",
    ),
}
CAPS = {"voice_calls": 20, "partner_sessions": 3, "serial_task": 1, "fan_out": 10}


def run_example(name: str, args: list[str], redis_url: str | None = None) -> str:
    """Run one example to its end; its summary line (the last line it prints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWCONTROL_EXAMPLE_")}
    if redis_url:
        env["FLOWCONTROL_EXAMPLE_REDIS"] = redis_url
    done = subprocess.run(  # noqa: S603 - our own interpreter and example
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        cwd=EXAMPLES,
        env=env,
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert done.returncode == 0, f"{name} exited with {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs_with_embedded_defaults(name: str) -> None:
    args, pattern = CASES[name]
    summary = run_example(name, args)
    match = re.fullmatch(pattern + r".*", summary)
    assert match, f"unexpected summary: {summary!r}"
    if name in CAPS:
        assert 1 <= int(match.group(1)) <= CAPS[name], summary


@pytest.mark.timeout(60)
def test_voice_calls_runs_on_redis(redis_url: str) -> None:
    summary = run_example("voice_calls", ["40"], redis_url)
    match = re.fullmatch(CASES["voice_calls"][1].replace("22", "40"), summary)
    assert match and int(match.group(1)) <= 20, summary


@pytest.mark.timeout(60)
def test_llm_quota_runs_on_redis(redis_url: str) -> None:
    """Costs settled, backoffs recorded and parked calls woken across processes on Redis."""
    summary = run_example("llm_quota", ["16"], redis_url)
    assert re.fullmatch(CASES["llm_quota"][1], summary), summary


@pytest.mark.timeout(60)
def test_latest_wins_runs_on_redis(redis_url: str) -> None:
    """The running rebuild stopped, the waiting ones never started, the newest one indexed."""
    summary = run_example("latest_wins", ["5"], redis_url)
    match = re.fullmatch(r"latest_wins: 5 saves, (\d+) rebuilds started, finished \[5\], 4 calls replaced "
                         r"\(REVOKED\), the newest returned version 5", summary)
    assert match and int(match.group(1)) <= 5, summary


def test_latest_wins_says_it_needs_redis() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWCONTROL_EXAMPLE_")}
    done = subprocess.run(  # noqa: S603 - our own interpreter and example
        [sys.executable, str(EXAMPLES / "latest_wins.py")], cwd=EXAMPLES, env=env,
        capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2 and "FLOWCONTROL_EXAMPLE_REDIS=redis://" in done.stderr, done


DJANGO_PROJECT = EXAMPLES / "django_project"


@pytest.mark.timeout(120)
def test_the_django_project_caps_its_queue(redis_url: str, redis_client: Any, key_prefix: str,
                                            tmp_path: Path) -> None:
    """examples/django_project as a Django user runs it: ``celery -A proj worker`` (prefork)
    in one shell, ``python manage.py charge_orders`` in another. Its settings are Django's,
    Celery's under the ``CELERY_`` namespace (``CELERY_FLOWCONTROL_QUEUES``: payments, 2 at
    once), read by ``config_from_object("django.conf:settings", namespace="CELERY")``."""
    env = {**os.environ, "REDIS_URL": redis_url, "CELERY_TASK_DEFAULT_QUEUE": f"{key_prefix}.django",
           "FLOWCONTROL_KEY_PREFIX": key_prefix,
           "FLOWCONTROL_PARKING_URL": f"sqlite:///{tmp_path / 'parking.sqlite3'}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # proj/celery.py and manage.py set their own
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(  # noqa: S603 - our own interpreter and example
        [sys.executable, "-m", "celery", "-A", "proj", "worker", "-P", "prefork", "-c", "4",
         "--loglevel=INFO", f"--logfile={log}", "-n", f"{key_prefix}@%h",
         "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=DJANGO_PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 45
        while "ready." not in (log.read_text() if log.exists() else ""):
            assert worker.poll() is None and time.monotonic() < deadline, \
                "the worker did not start:\n" + (log.read_text() if log.exists() else "")[-4000:]
            time.sleep(0.1)
        done = subprocess.run(  # noqa: S603
            [sys.executable, "manage.py", "charge_orders", "8"], cwd=DJANGO_PROJECT, env=env,
            capture_output=True, text=True, timeout=90, check=False)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}\n{log.read_text()[-4000:]}"
        summary = done.stdout.strip().splitlines()[-1]
        match = re.fullmatch(r"django_project: 8 orders charged, at most (\d+) at once \(capacity 2\)", summary)
        assert match and 1 <= int(match.group(1)) <= 2, summary
        # The worker read the namespaced settings: its queue, its prefix, its parking table.
        text = log.read_text()
        assert "admits through RedisBackend" in text, text[-4000:]
        assert list(redis_client.scan_iter(match=f"{key_prefix}:{{payments}}*")), "no admission state"
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
