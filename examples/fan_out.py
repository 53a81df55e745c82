"""A capped fan-out: 10,000 thumbnails, at most 50 in flight across the fleet.

``flow_group(signature, items, concurrency=50)`` publishes every member at once to an
ephemeral flow queue of concurrency 50 (``fg.<id>.50``); members over the cap are parked in SQL
and woken as slots free up. No parent task holds state in memory, the result is a
``GroupResult`` as ``group(...).apply_async()`` gives, and the queue is removed when the
group is done.

Run ``python examples/fan_out.py [ITEMS] [CONCURRENCY]`` (default 10000 50; the worker gets
CONCURRENCY + 10 pool processes, so the cap, not the pool, is what limits it).
"""

from __future__ import annotations

import sys
import time

from _run import make_app, max_in_flight, worker

from celery_flowcontrol import FlowTask, flow_group

app = make_app("fan_out")


@app.task(base=FlowTask)
def thumbnail(image_id: int) -> tuple[int, float, float]:
    """Render one thumbnail; (image id, start, end)."""
    start = time.time()
    time.sleep(0.01)
    return image_id, start, time.time()


def main(items: int, concurrency: int) -> int:
    with worker(app, concurrency=concurrency + 10):
        began = time.time()
        result = flow_group(thumbnail.s(), range(items), concurrency=concurrency)
        runs = result.get(timeout=max(60, items / 10), interval=0.2)
        wall = time.time() - began
    in_order = [image_id for image_id, _, _ in runs] == list(range(items))
    peak = max_in_flight((start, end) for _, start, end in runs)
    print(
        f"fan_out: {len(runs)} of {items} results in order: {in_order}, at most {peak} in flight "
        f"(concurrency {concurrency}), {wall:.1f} s"
    )
    return 0 if in_order and len(runs) == items and peak <= concurrency else 1


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    sys.exit(main(*(args + [10000, 50][len(args) :])))
