"""What every slot example shares: its app's settings and a real worker to run it on.

Embedded defaults (no server): kombu's ``filesystem://`` broker, the ``file://`` result
backend, in-process ``memory://`` admission and a SQLite parking table, all in a temp dir
that is removed at exit. With ``FLOWCONTROL_EXAMPLE_REDIS=redis://127.0.0.1:6379/0`` the
broker, the results and the admission backend are that Redis instead (keys under a prefix
unique to the run, deleted at exit); parking stays on SQLite.

An example module builds its app with :func:`make_app` at import (the worker imports the same
module) and runs its scenario inside ``with worker(app):``, which starts
``celery -A <module> worker -P prefork`` and stops it (warm shutdown) at the end.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from celery import Celery

from celery_flowcontrol import FlowControl
from celery_flowcontrol.testing.filesystem import AtomicFilesystemTransport

EXAMPLES = Path(__file__).resolve().parent
REDIS = os.environ.get("FLOWCONTROL_EXAMPLE_REDIS")


def _workdir() -> Path:
    """The run's folder, shared with the worker through the environment it inherits."""
    here = os.environ.get("FLOWCONTROL_EXAMPLE_DIR")
    if here is None:
        here = tempfile.mkdtemp(prefix="flowcontrol-example-")
        os.environ["FLOWCONTROL_EXAMPLE_DIR"] = here
        os.environ["FLOWCONTROL_EXAMPLE_PREFIX"] = f"fcx-{uuid.uuid4().hex[:8]}"
        atexit.register(_cleanup, Path(here), os.environ["FLOWCONTROL_EXAMPLE_PREFIX"])
    return Path(here)


def _cleanup(here: Path, prefix: str) -> None:
    shutil.rmtree(here, ignore_errors=True)
    if REDIS:
        import redis

        client = redis.Redis.from_url(REDIS)
        keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


def make_app(name: str, queues: Iterable[dict[str, Any]] = (), **conf: Any) -> Celery:
    """The app of example *name* (its module name), with flow control installed."""
    here = _workdir()
    prefix = os.environ["FLOWCONTROL_EXAMPLE_PREFIX"]
    app = Celery(name)
    app.conf.update(
        # Exactness: no prefetched message escapes admission, none is acked before it ran.
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_reject_on_worker_lost=True,
        task_default_queue=f"{prefix}.{name}",
        result_expires=3600,
        flowcontrol_queues=list(queues),
        flowcontrol_parking_url=f"sqlite:///{here / 'parking.sqlite3'}",
        flowcontrol_key_prefix=prefix,
        flowcontrol_poll_interval=0.1,
    )
    if REDIS:
        app.conf.update(
            broker_url=REDIS,
            result_backend=REDIS,
            flowcontrol_backend_url=REDIS,
            result_backend_transport_options={"global_keyprefix": f"{prefix}:"},
        )
    else:
        for folder in ("broker", "control", "results"):
            (here / folder).mkdir(exist_ok=True)
        app.conf.update(
            broker_url="filesystem://",
            broker_transport=AtomicFilesystemTransport,
            broker_transport_options={
                "data_folder_in": str(here / "broker"),
                "data_folder_out": str(here / "broker"),
                "control_folder": str(here / "control"),
                "polling_interval": 0.02,  # kombu's 1 s would delay every wake by up to 1 s
            },
            result_backend=f"file://{here / 'results'}",
            flowcontrol_backend_url="memory://",
        )
    app.conf.update(conf)
    FlowControl(app)
    return app


def _log(here: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (here / "worker.log", here / "worker.out") if p.exists())


@contextmanager
def worker(app: Celery, concurrency: int = 4) -> Iterator[None]:
    """Run ``celery -A <app.main> worker -P prefork -c <concurrency>`` for the block."""
    here = _workdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")]))}
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        str(app.main),
        "worker",
        "-P",
        "prefork",
        "-c",
        str(concurrency),
        "--loglevel=INFO",
        f"--logfile={here / 'worker.log'}",
        "-n",
        f"{app.main}@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    with (here / "worker.out").open("wb") as out:
        proc = subprocess.Popen(
            command,
            cwd=here,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 45
        while "ready." not in _log(here):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the worker did not start:\n" + _log(here)[-4000:])
            time.sleep(0.1)
        yield
    except BaseException:
        print("--- worker log (tail) ---\n" + _log(here)[-4000:], file=sys.stderr)
        raise
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def max_in_flight(spans: Iterable[tuple[float, float]]) -> int:
    """The most (start, end) spans open at once."""
    spans = list(spans)
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    peak = now = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak
