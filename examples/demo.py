"""celery-flowcontrol in one minute, with no server: run ``python examples/demo.py``.

It starts a real ``celery worker`` (prefork, 8 processes) on a filesystem broker in a temp
dir, sends 200 tasks of 100 ms to the flow queue ``demo`` (at most 5 at once, at most 40 admissions
in any 1 s), shows their progress, and ends with what the tasks measured themselves: the most
in flight at once, the peak rate, how often tasks were parked and woken, and the wall time.

Exit status: 0 when every task ran and the cap of 5 held; 1 otherwise (the worker's log is
printed). ``--tasks N`` sends another number of tasks; ``--keep`` keeps the temp dir.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

EXAMPLES = Path(__file__).resolve().parent


def peak_in_window(times: list[float], width: float) -> int:
    """The most instants inside any span ``[t, t + width)``."""
    times = sorted(times)
    best = j = 0
    for i, t in enumerate(times):
        while times[j] <= t - width:
            j += 1
        best = max(best, i - j + 1)
    return best


def read(db: Path, sql: str) -> list[tuple]:
    """Rows of one query on a SQLite file, or [] while it does not exist yet."""
    if not db.exists():
        return []
    conn = sqlite3.connect(db, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the table is not created yet
        return []
    finally:
        conn.close()


def parked_now(here: Path) -> tuple[int, int]:
    """(messages parked right now, park events so far): AUTOINCREMENT never reuses a seq."""
    db = here / "parking.sqlite3"
    now = read(db, "SELECT count(*) FROM flowcontrol_parked")
    events = read(db, "SELECT seq FROM sqlite_sequence WHERE name = 'flowcontrol_parked'")
    return (now[0][0] if now else 0), (events[0][0] if events else 0)


def start_worker(here: Path) -> subprocess.Popen[bytes]:
    """``celery -A demo_tasks worker -P prefork -c 8`` in its own process group."""
    env = {**os.environ, "FLOWCONTROL_DEMO_DIR": str(here)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLES), env.get("PYTHONPATH")]))
    command = [
        sys.executable, "-m", "celery", "-A", "demo_tasks", "worker", "-P", "prefork", "-c", "8",
        "--loglevel=INFO", f"--logfile={here / 'worker.log'}", "-n", "demo@%h",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    with (here / "worker.out").open("wb") as out:
        return subprocess.Popen(command, cwd=here, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


def worker_log(here: Path) -> str:
    """The worker's log and console output."""
    return "\n".join(p.read_text(errors="replace") for p in (here / "worker.log", here / "worker.out") if p.exists())


def stop(worker: subprocess.Popen[bytes]) -> None:
    """Warm shutdown, then SIGKILL of the whole group after 15 s."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    worker.wait()


def run(here: Path, total: int) -> int:
    """Run the demo in ``here``; the exit status."""
    for folder in ("broker", "processed", "control"):
        (here / folder).mkdir(parents=True, exist_ok=True)
    os.environ["FLOWCONTROL_DEMO_DIR"] = str(here)
    sys.path.insert(0, str(EXAMPLES))
    import demo_tasks

    demo_tasks.measure_db().close()
    print(f"celery-flowcontrol demo: {total} tasks of {demo_tasks.TASK_SECONDS * 1000:.0f} ms through flow queue "
          f"'demo' (concurrency {demo_tasks.CONCURRENCY}, {demo_tasks.RATE} per 1 s), 8 pool processes")  # fmt: skip
    print(f"broker: filesystem ({here / 'broker'}), admission: memory://, parking: SQLite")
    worker = start_worker(here)
    try:
        deadline = time.monotonic() + 45
        while "ready." not in worker_log(here):
            if worker.poll() is not None or time.monotonic() > deadline:
                print("the worker did not start:\n" + worker_log(here)[-4000:])
                return 1
            time.sleep(0.05)
        began = time.time()
        for n in range(total):
            demo_tasks.work.delay(n)
        measure = here / "measure.sqlite3"
        done = 0
        deadline = time.monotonic() + 50
        figures = ""
        with click.progressbar(length=total, label="tasks", show_pos=True, width=30,
                               item_show_func=lambda _: figures) as progress:
            while time.monotonic() < deadline:
                done = read(measure, "SELECT count(DISTINCT n) FROM runs")[0][0]
                inflight = read(measure, "SELECT inflight FROM gauge")[0][0]
                parked, _ = parked_now(here)
                figures = f"in flight {inflight}  parked {parked:3d}"
                progress.update(done - progress.pos)
                if done == total:
                    break
                time.sleep(0.1)
        wall = time.time() - began
    finally:
        stop(worker)
    return summary(here, total, wall, demo_tasks)


def summary(here: Path, total: int, wall: float, demo_tasks: object) -> int:
    """Print what the tasks measured; 0 if nothing was lost and the cap held."""
    concurrency, rate = getattr(demo_tasks, "CONCURRENCY"), getattr(demo_tasks, "RATE")  # noqa: B009
    measure = here / "measure.sqlite3"
    runs = read(measure, "SELECT n, admitted, end FROM runs")
    peak = read(measure, "SELECT peak FROM gauge")[0][0]
    ran = {n for n, _, _ in runs}
    admitted = [at for _, at, _ in runs]
    left, events = parked_now(here)
    peak_rate = peak_in_window(admitted, 1.0) if admitted else 0
    lost = total - len(ran)
    print()
    print(
        f"tasks run            {len(ran)} of {total}"
        + (f"  ({len(runs) - len(ran)} ran twice)" if len(runs) > len(ran) else "")
    )
    print(f"most in flight       {peak}   (cap {concurrency})")
    print(f"peak rate            {peak_rate} admissions in a 1 s window   (limit {rate})")
    print(f"parked / woken       {events} times / {events - left} times   ({left} still parked)")
    print(f"wall time            {wall:.1f} s   (at least {total / rate:.1f} s at {rate}/s)")  # fmt: skip
    problems = []
    if lost:
        problems.append(f"{lost} tasks never ran")
    if peak > concurrency:
        problems.append(f"the cap of {concurrency} was exceeded ({peak} at once)")
    if peak_rate > rate:
        problems.append(f"the rate limit of {rate}/s was exceeded ({peak_rate} in 1 s)")
    if problems:
        print("FAILED: " + "; ".join(problems) + "\n" + worker_log(here)[-4000:])
        return 1
    print("OK: nothing lost, the cap held.")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the demo in a fresh temp dir."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=200, help="how many tasks to send (200)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (broker, logs, SQLite files)")
    args = parser.parse_args(argv)
    here = Path(tempfile.mkdtemp(prefix="flowcontrol-demo-"))
    try:
        return run(here, args.tasks)
    finally:
        if args.keep:
            print(f"kept {here}")
        else:
            shutil.rmtree(here, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
