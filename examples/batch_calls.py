"""Batches: ``flow_batch`` runs a task once for many of its calls, each call keeping its own
result.

An app embeds short texts one at a time, but the embedding API is cheaper per call with many
texts at once. ``embed`` takes up to 8 calls of one model per run, waiting at most 0.5 s for
a batch to fill; each caller still gets its own vector (here: the text's length and the size
of the batch it ran in). The calls wait as parked rows, not in worker memory: a worker that
dies while a batch forms loses nothing.

Run ``python examples/batch_calls.py [CALLS]`` (default 20).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from _run import make_app, worker

from celery_flowcontrol import BatchCall, FlowTask

app = make_app("batch_calls", [{"name": "embeddings", "concurrency": 2}])
RUNS = Path(os.environ["FLOWCONTROL_EXAMPLE_DIR"]) / "runs.txt"


@app.task(base=FlowTask, flow_queue="embeddings",
          flow_batch={"size": 8, "wait": "0.5s", "key": lambda args, kwargs: kwargs["model"]})
def embed(calls: list[BatchCall]) -> dict[str, tuple[int, int]]:
    """One API request for every call of the batch; a result per call, by the call's id."""
    models = {call.kwargs["model"] for call in calls}
    with RUNS.open("a") as f:
        f.write(f"{len(calls)} {','.join(sorted(models))}\n")
    return {call.id: (len(call.kwargs["text"]), len(calls)) for call in calls}


def main(calls: int) -> int:
    with worker(app, concurrency=2):
        results = [embed.delay(text="x" * (i + 1), model="small" if i % 2 else "large")
                   for i in range(calls)]
        vectors = [r.get(timeout=30) for r in results]
    runs = [line.split() for line in RUNS.read_text().splitlines()]
    sizes = [int(size) for size, _ in runs]
    own = all(vector[0] == i + 1 for i, vector in enumerate(vectors))
    mixed = any("," in models for _, models in runs)
    print(f"batch_calls: {calls} calls ran in {len(runs)} batches of at most {max(sizes)} "
          f"(size 8), every call got its own result: {own}, models mixed in a batch: {mixed}")
    return 0 if own and not mixed and sum(sizes) == calls and max(sizes) <= 8 else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
