"""AdaptiveAutoscaler in a few lines: a worker whose pool follows a slow downstream.

Run Redis on 127.0.0.1:6379, then in two shells::

    celery -A examples.autoscale_basic worker --autoscale=16,1 -l info
    python -m examples.autoscale_basic          # queue 500 tasks, then print the figures

and watch the limit climb while latency stays flat (``AdaptiveAutoscaler: 3 -> 4 (probe: ...)``).
``celery -A examples.autoscale_basic inspect flowcontrol_stats`` shows the same figures.
"""

from __future__ import annotations

import json
import time

from celery import Celery

import celery_flowcontrol.worker.control  # noqa: F401  (`inspect flowcontrol_stats` in this process)

app = Celery("autoscale_basic", broker="redis://127.0.0.1:6379/0")
app.conf.update(
    worker_autoscaler="celery_flowcontrol.autoscale:AdaptiveAutoscaler",
    flowcontrol_autoscale={"tick": 1.0, "ram_ceiling_pct": 85},
    task_acks_late=True,  # with prefetch 1, a cut holds where tasks are admitted
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
)


@app.task
def call_downstream(seconds: float = 0.05) -> None:
    """Stands in for an HTTP call that takes ``seconds``."""
    time.sleep(seconds)


if __name__ == "__main__":
    for _ in range(500):
        call_downstream.delay()
    time.sleep(10)
    print(json.dumps(app.control.inspect(timeout=2.0)._request("flowcontrol_stats"), indent=2))
