"""``flow_batch``: calls parked one by one, run together as one task run (docs/collapse.md).

Publish: the call's message is captured (as a debounced call's is) and parked as a waiting
call of its batch key (parking/batches.py), committed before ``apply_async`` returns; the
caller gets the call's own ``AsyncResult``. The first call of a gathering batch also parks
the batch's row (the task's message, no arguments, a :data:`BATCH_HEADER` naming key and
size), due ``wait`` after it; each call counts itself into its batch (``Claims.join``), and
the call that makes ``size`` makes it due now.
Which batch gathers a key is a claim (``claims``, kind ``batch``). A call parks its row
before it reads the claim, so a call that joins a batch is a row before that batch's run
frees the key. The run takes its calls, then frees the key, then counts the calls of its
key still waiting (more than ``size``, or parked while it took): if some do and it wins
the key, it starts the next batch for them (:func:`start_next`), due ``wait`` after the
oldest of them, or now if ``size`` wait. A call that arrives between batches finds no
holder and claims the key itself. So every waiting call has a batch to come.

Run: :func:`run_batch` takes the batch's calls, calls the task with ``list[BatchCall]`` and
stores each call's item under the call's id.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kombu.compression import compress, decompress
from kombu.serialization import dumps, loads, registry
from kombu.utils.uuid import uuid

from ..errors import CollapseError
from ..parking import ParkedMessage
from ..parking.batches import BATCH, BATCH_CALL, NEVER, BatchRows, gathering
from ..protocol import PRIORITY_HEADER, QUEUE_HEADER
from .claims import MemoryClaims
from .keys import called_key, fit_key, option_duration, option_of
from .publish import Send, capture, decided, eta_of, int_or_zero
from .wiring import claims_of


def set_headers(store: Any, task_id: str, headers: dict[str, Any]) -> None:
    """Replace parked *task_id*'s headers."""
    from sqlalchemy import update

    from ..parking.model import encode_json
    from ..parking.statements import PARKED
    stmt = update(PARKED).where(PARKED.c.task_id == task_id).values(headers=encode_json(headers))
    store.db.run(lambda conn: conn.execute(stmt))

__all__ = ["BATCH_HEADER", "BatchCall", "BatchSpec", "MAX_BATCH", "batch_call", "batch_spec",
           "check_batch_task", "publish_batched", "start_next", "sweep"]

#: The header of a batch's run: ``{"key": batch key, "size": at most this many calls}``.
BATCH_HEADER = "flow_batch"
#: The largest ``size`` a batch may have.
MAX_BATCH = 10_000
#: Seconds a batch key's claim outlives its batch's due time.
GRACE = 60.0


@dataclass(frozen=True, slots=True)
class BatchCall:
    """One call of a batch: its task ``id`` (its own ``AsyncResult``), ``args``, ``kwargs``."""

    id: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """A task's ``flow_batch``: at most *size* calls, formed *wait* s after the oldest."""

    size: int
    wait: float
    key: Any = None


def batch_spec(task: str, value: Any) -> BatchSpec | None:
    """The :class:`BatchSpec` of ``flow_batch=value``; ``None``: not batched."""
    if value is None or value is False:
        return None
    if not isinstance(value, dict):
        raise CollapseError(f"must be a dict with size, wait and key, got {value!r:.60}",
                            task, "flow_batch")
    unknown = set(value) - {"size", "wait", "key"}
    if unknown:
        raise CollapseError(f"unknown field(s) {sorted(unknown)}", task, "flow_batch")
    size = value.get("size", 100)
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_BATCH:
        raise CollapseError(f"size must be an int from 1 to {MAX_BATCH}, got {size!r:.60}",
                            task, "flow_batch")
    wait = option_duration(value.get("wait", "1s"), task, "flow_batch")
    if wait <= 0:
        raise CollapseError(f"wait must be > 0, got {wait!r}", task, "flow_batch")
    key = value.get("key")
    if key is not None and not callable(key) and not (isinstance(key, str) and key):
        raise CollapseError(f"key must be a callable (args, kwargs) -> str or a str, got "
                            f"{key!r:.60}", task, "flow_batch")
    return BatchSpec(size, wait, key)


def batch_key(task: str, spec: BatchSpec, args: Any, kwargs: Any) -> str:
    """The batch key of one call: the task name, and the key's string when there is one."""
    if spec.key is None:
        return fit_key(task)
    if isinstance(spec.key, str):
        return fit_key(f"{task}:{spec.key}")
    return fit_key(f"{task}:{called_key(spec.key, args, kwargs, task, 'flow_batch')}")


def batch_call(app: Any, name: str, args: Any, kwargs: Any, task_id: str | None,
               options: dict[str, Any], spec: BatchSpec, send: Send, send_empty: Send,
               result: Callable[[str], Any]) -> Any:
    """Park this call of task *name* for a batch (module docstring); its own result.
    *send_empty* publishes the task with no arguments: the batch's own message."""
    bkey = batch_key(name, spec, args, kwargs)
    own = task_id or uuid()
    message = capture(app, name, own, options, send)
    store = rows_of(app).store
    now = time.time()
    row = _row(own, gathering(bkey), name, message, NEVER, BATCH_CALL)
    store.park(row)
    claims = claims_of(app)
    holder = claims.holder("batch", bkey)
    if holder is not None and isinstance(claims, MemoryClaims) and store.get(holder) is None:
        # In-process claims: the batch was woken and ran in a worker's process, which freed
        # the key in its own memory only. This process frees it here, or calls would join a
        # batch that is gone until its claim lapsed (wait + GRACE).
        claims.release("batch", bkey, holder)
        holder = None
    if holder is None:
        batch = uuid()
        holder = claims.claim("batch", bkey, batch, spec.wait + GRACE)
        if holder == batch:
            _park_batch(app, name, batch, bkey, spec, options, send_empty, now + spec.wait)
    _parked_state(app, row, holder, now + spec.wait)
    # The calls that joined this batch, not every call waiting: calls a full batch due now
    # has not taken yet are its own, and must not make the next batch full too.
    if spec.size == 1 or claims.join("batch", holder, spec.wait + GRACE) >= spec.size:
        _due_now(app, holder, bkey, now)
    return result(own)


def _parked_state(app: Any, row: ParkedMessage, holder: str | None, due: float) -> None:
    """The call's ``PARKED`` state, when tracked: due when its batch (*holder*) is, else at
    *due* (the latest the next batch is due)."""
    from ..engines import engines_of
    from ..parked_state import parked_by_producer

    if not engines_of(app).settings.track_parked:
        return
    batch = rows_of(app).store.get(holder) if holder is not None else None
    if batch is not None:
        due = batch.wake_at
    parked_by_producer(app, [replace(row, wake_at=due)])


def _park_batch(app: Any, name: str, batch: str, bkey: str, spec: BatchSpec,
                options: dict[str, Any], send: Send, due: float) -> None:
    headers = dict(options.get("headers") or {})
    headers[BATCH_HEADER] = {"key": bkey, "size": spec.size, "wait": spec.wait}
    message = capture(app, name, batch, {**options, "headers": headers}, send)
    message["headers"]["eta"] = eta_of(due)
    queue = str(message["headers"].get(QUEUE_HEADER) or BATCH)
    rows_of(app).store.park(_row(batch, queue, name, message, due, BATCH))


def start_next(app: Any, name: str, bkey: str, size: int, wait: float) -> str | None:
    """After a batch of *bkey* took its calls and freed the key: start the next batch if
    calls still wait and no batch gathers them; its id, ``None``: none started. A batch
    that holds the key already takes them, or starts the next itself when its run does."""
    rows = rows_of(app)
    waiting = rows.waiting(bkey)
    if not waiting:
        return None
    batch = uuid()
    claims = claims_of(app)
    if claims.claim("batch", bkey, batch, wait + GRACE) != batch:
        return None
    first = rows.first(bkey)
    if first is None:  # another batch took them meanwhile
        claims.release("batch", bkey, batch)
        return None
    now = time.time()
    due = now if waiting >= size else (first.parked_at or now) + wait
    rows.store.park(_batch_from_call(first, batch, bkey, size, wait, due))
    if waiting >= size:  # as a call that fills a batch does: the next call starts another
        claims.release("batch", bkey, batch)
    else:  # the calls it starts with count toward its size, as joining calls do
        claims.join("batch", batch, wait + GRACE, waiting)
    return batch


def sweep(app: Any, now: float | None = None, limit: int = 100) -> list[str]:
    """Start a batch for calls that wait with none to come; the batches started. A producer
    that died after parking a call and before parking its batch (or a claim on the key
    whose batch was never parked) leaves calls no batch will take: once the oldest of a
    key's calls waited ``wait`` and the key's claim could have lapsed (:data:`GRACE`), a
    batch is started for them if no batch holds the key (:func:`start_next`). A batch that
    was only slow (parked by its flow queue) still runs, taking what is left: each call is
    taken once (parking/batches.py). The waker's chores and the ``flowcontrol.wake_due``
    beat task call it."""
    now = time.time() if now is None else now
    rows = rows_of(app)
    started = []
    for bkey, _, oldest in rows.gathering_keys(limit):
        if now - oldest < GRACE:
            break  # oldest first: the rest are younger still
        first = rows.first(bkey)
        task = app.tasks.get(first.task_name) if first is not None else None
        if task is None:
            continue  # not a task this app knows: a process that knows it sweeps it
        spec = batch_spec(task.name, option_of(task, "flow_batch"))
        if spec is None or now - oldest < spec.wait + GRACE:
            continue  # not a batch task here, or its batch may still come
        batch = start_next(app, task.name, bkey, spec.size, spec.wait)
        if batch is not None:
            started.append(batch)
    return started


def _batch_from_call(call: ParkedMessage, batch: str, bkey: str, size: int, wait: float,
                     due: float) -> ParkedMessage:
    """A batch's row made from the message of its oldest call (its queue, priority, key,
    cost and routing, as the first call's options give a batch its row at publish), with
    no arguments and its own id."""
    data = call.body
    zipped = call.headers.get("compression")
    if zipped:
        data = decompress(data, zipped)
    body = loads(data, call.content_type, call.content_encoding, accept={call.content_type})
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    if isinstance(body, (list, tuple)) and len(body) > 2 and isinstance(body[2], dict):
        embed = {**body[2], **embed}
    content_type, encoding, out = dumps([[], {}, embed], registry.type_to_name[call.content_type])
    raw = out if isinstance(out, bytes) else str(out).encode(encoding)
    headers = dict(call.headers)
    if zipped:
        raw, headers["compression"] = compress(raw, zipped)
    if headers.get("root_id") in (None, call.task_id):
        headers["root_id"] = batch
    headers.update({"id": batch, "argsrepr": "()", "kwargsrepr": "{}", "eta": eta_of(due),
                    BATCH_HEADER: {"key": bkey, "size": size, "wait": wait}})
    properties = dict(call.properties or {})
    if "correlation_id" in properties:
        properties["correlation_id"] = batch
    queue = str(headers.get(QUEUE_HEADER) or BATCH)
    return ParkedMessage(
        task_id=batch, queue=queue, body=raw, wake_at=due, task_name=call.task_name,
        priority=call.priority, content_type=content_type, content_encoding=encoding,
        headers=headers, properties=properties, exchange=call.exchange,
        routing_key=call.routing_key, reason=BATCH)


def _due_now(app: Any, batch: str, bkey: str, now: float) -> None:
    """Make gathering batch *batch* due now (``size`` calls wait), and let the next call
    start another."""
    store = rows_of(app).store
    row = store.get(batch)
    if row is not None and row.claimed_until is None:
        store.reschedule(batch, now)
        headers = dict(row.headers)
        headers["eta"] = eta_of(now)
        set_headers(store, batch, headers)
    claims_of(app).release("batch", bkey, batch)


def _row(task_id: str, queue: str, name: str, message: dict[str, Any], wake: float,
         reason: str) -> ParkedMessage:
    headers = message["headers"]
    return ParkedMessage(
        task_id=task_id, queue=queue, body=message["body"], wake_at=wake, task_name=name,
        priority=int_or_zero(headers.get(PRIORITY_HEADER)), content_type=message["content_type"],
        content_encoding=message["content_encoding"], headers=headers,
        properties=message["properties"], exchange=message["exchange"],
        routing_key=message["routing_key"], reason=reason)


def rows_of(app: Any) -> BatchRows:
    """The batched calls of *app*'s parking store."""
    from ..engines import engines_of
    return BatchRows(engines_of(app).store)


def call_of(row: ParkedMessage) -> BatchCall:
    """The :class:`BatchCall` of a parked call (its body decompressed first, if it was sent
    with ``compression=``)."""
    data = row.body
    if row.headers.get("compression"):
        data = decompress(data, row.headers["compression"])
    body = loads(data, row.content_type, row.content_encoding, accept={row.content_type})
    args, kwargs = (body[0], body[1]) if isinstance(body, (list, tuple)) else ((), {})
    return BatchCall(row.task_id, tuple(args or ()), dict(kwargs or {}))



def check_batch_task(cls: Any) -> None:
    """Check a task class's ``flow_batch`` when it is made (a bad one raises CollapseError).
    A batch task's calls take the arguments of its calls, not of its signature (which takes
    the list of calls), so Celery's argument check is off for it; it acks late (and
    rejects a run whose worker was lost), so a batch whose worker dies runs again, with the same calls."""
    value = option_of(cls, "flow_batch")
    if value in (None, False):
        return
    batch_spec(cls.name, value)
    for other in ("flow_unique", "flow_unique_keep", "flow_debounce"):
        if option_of(cls, other) not in (None, False):
            raise CollapseError(f"can't be used with {other}", cls.name, "flow_batch")
    cls.typing = False
    # The calls a run took are rows until their results are stored: acked after the run,
    # a run whose worker died is delivered again and takes the same calls.
    cls.acks_late = True
    cls.reject_on_worker_lost = True


def publish_batched(task: Any, args: Any, kwargs: Any, task_id: str | None,
                    options: dict[str, Any], send: Send, send_empty: Send) -> Any:
    """``apply_async`` of a call of *task* that is batched (``flow_batch`` given or the
    task's default, not ``False``): parked for a batch, its ``AsyncResult``; ``None``: the
    call is not batched (send it as usual)."""
    value = options.pop("flow_batch", None)
    default = option_of(task, "flow_batch")
    if value is False and default not in (None, False):
        # The body takes list[BatchCall]: an ordinary message would hand it the call's own.
        raise CollapseError("can't be False per call: the task's body takes list[BatchCall]; "
                            "call the task's function directly for one call",
                            task.name, "flow_batch")
    if value is None:
        value = default
    if value in (None, False) or task.app.conf.task_always_eager or options.get("retries"):
        return None
    spec = batch_spec(task.name, value)
    for other in ("flow_unique", "flow_unique_keep", "flow_debounce"):
        if options.get(other) or option_of(task, other) not in (None, False):
            raise CollapseError(f"can't be used with {other}", task.name, "flow_batch")
    if spec is None:
        return None
    # Decided: the wrapped send_task these go through must not batch them again (sending.py).
    return batch_call(task.app, task.name, args, kwargs, task_id, options, spec, decided(send),
                      decided(send_empty), task.AsyncResult)
