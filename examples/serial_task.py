"""A serial task: one run at a time, fleet-wide, in the order the runs arrived; no config.

``serial=True`` gives the task its own concurrency-1 FIFO flow queue (``serial.<task name>``).
Here 8 migration steps are sent at once to a worker with 4 pool processes: they still run
one after the other, in order.

Run ``python examples/serial_task.py [STEPS]`` (default 8).
"""

from __future__ import annotations

import sys
import time

from _run import make_app, max_in_flight, worker

from celery_flowcontrol import FlowTask

app = make_app("serial_task")


@app.task(base=FlowTask, serial=True)
def apply_migration(step: int) -> tuple[int, float, float]:
    """One schema migration step: never two at once."""
    start = time.time()
    time.sleep(0.1)
    return step, start, time.time()


def main(steps: int) -> int:
    with worker(app, concurrency=4):
        first = apply_migration.delay(0)
        time.sleep(0.3)  # the first step holds the slot; the rest arrive in order behind it
        results = [first] + [apply_migration.delay(n) for n in range(1, steps)]
        runs = [tuple(r.get(timeout=60)) for r in results]
    order = [step for step, _, _ in sorted(runs, key=lambda run: run[1])]
    peak = max_in_flight((start, end) for _, start, end in runs)
    print(f"serial_task: {len(runs)} steps, at most {peak} at once, in order: {order == list(range(steps))}")
    return 0 if peak == 1 and order == list(range(steps)) else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 8))
