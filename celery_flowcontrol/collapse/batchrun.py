"""A batch's run: take its calls, call the task once, give each call its item.

The task body gets ``list[BatchCall]``; ``self.request.flow_batch`` is the list of the
calls' ids. Its return is a dict by call id or a list in call order; an exception instance
as an item fails that call alone; the body raising fails every call (a retry retries the
batch, which takes the same calls again). A return of another shape fails every call with
a :class:`~celery_flowcontrol.errors.CollapseError` naming the task and ``flow_batch``.
Each call's row goes only once every call's result is stored. The batch's admission costs
the sum of its calls' ``flow_cost``.

This is the worker's side of a batch: ``FlowTask.__call__`` reaches :func:`run` by name
(``FlowTask.BatchRun``), as Celery reaches the task's ``Strategy`` and ``Request``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from celery.exceptions import Retry
from celery.states import FAILURE, SUCCESS

from ..errors import CollapseError, FlowControlError
from ..protocol import COST_HEADER, read_cost
from ..worker.backend_calls import call_backend
from ..worker.crashpoints import crashpoint
from .batching import BatchCall, batch_spec, call_of, rows_of, start_next
from .wiring import batch_stats_of, claims_of

__all__ = ["run", "items_of"]

logger = logging.getLogger(__name__)


def items_of(task: str, calls: list[BatchCall], value: Any) -> list[Any]:
    """The item of each call, in call order, from the batch's return *value*."""
    if isinstance(value, dict) and set(value) == {c.id for c in calls}:
        return [value[c.id] for c in calls]
    if isinstance(value, (list, tuple)) and len(value) == len(calls):
        return list(value)
    shape = (f"a dict of {len(value)} ids" if isinstance(value, dict) else
             f"a list of {len(value)}" if isinstance(value, (list, tuple)) else
             type(value).__name__)
    raise CollapseError(f"the batch of {len(calls)} calls returned {shape}: return a list "
                        "of its length or a dict of its call ids", task, "flow_batch")


def _charge(task: Any, costs: list[Any]) -> None:
    """Make the batch's one admission cost the sum of its calls' ``flow_cost``: admitted at
    the first call's cost (the others were not taken yet), corrected now, as ``settle_cost``
    does: in Redis, or, with an in-process backend, by the worker that holds it (a pool
    process asks its worker through remote control, worker/backend_calls.py)."""
    slot = getattr(task.request, "flow_slot", None)
    if not slot or getattr(task.request, "flow_settled", False):
        return
    total = sum(c if math.isfinite(c := read_cost(v)) else 1 for v in costs)
    try:
        call_backend(task.app, "settle", slot_id=slot, actual=total)
    except FlowControlError as exc:
        logger.warning("flow_batch: the batch %s keeps its admission's cost: %s",
                       task.request.id, exc)
        return
    task.request.flow_settled = True


def _wait_of(task: Any, header: Any) -> float:
    """The batch's ``wait``: from its header, else the task's ``flow_batch``."""
    wait = header.get("wait")
    if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait > 0:
        return float(wait)
    spec = batch_spec(task.name, getattr(task, "flow_batch", None))
    return spec.wait if spec is not None else 1.0


def run(task: Any, header: Any) -> Any:
    """Run the batch of this request (``header``: its ``flow_batch`` header)."""
    batch = str(task.request.id)
    rows = rows_of(task.app)
    key, size = str(header["key"]), int(header["size"])
    taken = rows.take(batch, key, size)
    crashpoint("batch.taken")
    # Free the key after taking, then look: a call that joined this batch too late (or past
    # its size) is a row by now, and gets the next batch (batching.py).
    claims_of(task.app).release("batch", key, batch)
    start_next(task.app, task.name, key, size, _wait_of(task, header))
    calls = [call_of(r) for r in taken]
    task.request.flow_batch = [c.id for c in calls]
    if not calls:
        return {}
    _charge(task, [r.headers.get(COST_HEADER, 1) for r in taken])
    backend = task.backend
    try:
        value = task.run(calls)
        items = items_of(task.name, calls, value)
    except Retry:
        raise
    except BaseException as exc:
        for c in calls:
            backend.store_result(c.id, exc, FAILURE)
        rows.finish(batch)
        _count(task, len(calls))
        raise
    for c, item in zip(calls, items, strict=True):
        if isinstance(item, BaseException):
            backend.store_result(c.id, item, FAILURE)
        else:
            backend.store_result(c.id, item, SUCCESS)
    rows.finish(batch)
    _count(task, len(calls))
    return {"calls": len(calls)}


def _count(task: Any, size: int) -> None:
    """Count the finished batch for metrics (batchstats.py); an outage loses the count only."""
    try:
        batch_stats_of(task.app).record(task.name, size)
    except Exception as exc:
        logger.warning("flow_batch: the batch %s is not counted: %s", task.request.id, exc)
