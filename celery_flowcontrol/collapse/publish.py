"""What ``FlowTask.apply_async`` does with ``flow_unique`` and ``flow_debounce``.

Unique: the call claims its key for its task id (``claims``); a key held by another call
that has not landed returns that call's ``AsyncResult`` and nothing is sent. A claimed key
travels in the :data:`UNIQUE_KEY_HEADER` header, so the worker frees it when the result
lands (landing.py) and a retry, which carries the same id and header, keeps it.

Latest wins (``flow_unique_keep="latest"``): the call is sent and becomes its key's newest;
the call it replaces ends REVOKED (latestwins.py).

Debounce: the call becomes a parked row (parking/debounce.py) due ``flow_debounce`` after
it; a later call of the same burst replaces that row's arguments and pushes it back (never
past ``flow_debounce_max`` after the burst's first call). Every call of a burst returns the
burst's task id, the id the run gets. The row is the message Celery would have sent,
captured at the producer (:class:`CaptureProducer`), so the waker publishes it as any row.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from kombu import Producer
from kombu.compression import compress
from kombu.serialization import dumps
from kombu.utils.uuid import uuid

from ..engines import engines_of
from ..errors import CollapseError
from ..parked_state import parked_by_producer
from ..parking import ParkedMessage
from ..parking.debounce import DEBOUNCE
from ..protocol import (
    BURST_HEADER,
    DEBOUNCE_HEADER,
    DEBOUNCE_KEY_HEADER,
    DEBOUNCE_MAX_HEADER,
    DUPLICATE_HEADER,
    PRIORITY_HEADER,
    QUEUE_HEADER,
    UNIQUE_HEADER,
    UNIQUE_KEEP_HEADER,
    UNIQUE_KEY_HEADER,
    UNIQUE_TTL_HEADER,
    read_burst,
)
from .keys import (
    DebounceSpec,
    debounce_key,
    debounce_spec,
    option_of,
    unique_keep,
    unique_key,
    unique_ttl,
    wake_of,
)
from .latest import LATEST
from .latestwins import latest_call, mark_replaced, revoke_run
from .wiring import claims_of, debounce_rows_of, latest_of

__all__ = ["COLLAPSED_TASK", "DECIDED", "CaptureProducer", "HEADERS", "call_options",
           "collapse_call", "debounce_call", "decided", "mark_duplicate"]

#: What a duplicate sent by name becomes: a task that runs nothing (landing.py registers it).
COLLAPSED_TASK = "flowcontrol.collapsed"

#: Seconds a debounce key outlives its burst's due time (a late waker still finds it).
BURST_GRACE = 60.0
#: Publish options that say how to send, not what: not kept in a debounced row.
NOT_PROPERTIES = frozenset(("exchange", "routing_key", "serializer", "compression", "retry",
                            "retry_policy", "declare", "headers", "timeout", "confirm_timeout",
                            "mandatory", "immediate", "content_type", "content_encoding"))

Send = Callable[[str, dict[str, Any]], Any]

#: The collapse options ``apply_async`` takes per call (and a task as decorator defaults).
OPTIONS = ("flow_unique", "flow_unique_ttl", "flow_unique_keep", "flow_debounce",
           "flow_debounce_max", "debounce_key")
#: The header a call sent by name (``send_task``) gives each option in.
HEADERS = {"flow_unique": UNIQUE_HEADER, "flow_unique_ttl": UNIQUE_TTL_HEADER,
           "flow_unique_keep": UNIQUE_KEEP_HEADER,
           "flow_debounce": DEBOUNCE_HEADER,
           "flow_debounce_max": DEBOUNCE_MAX_HEADER, "debounce_key": DEBOUNCE_KEY_HEADER}

#: True while :func:`collapse_call` or the wrapped ``send_task`` (sending.py) sends a call
#: whose collapsing is decided already: the wrapper, which ``apply_async`` goes through, and
#: the ``before_task_publish`` hook (landing.py) leave it alone.
DECIDED: contextvars.ContextVar[bool] = contextvars.ContextVar("flowcontrol_collapse_decided",
                                                               default=False)


def decided(send: Send) -> Send:
    """*send*, with :data:`DECIDED` set while it runs."""
    def sending(task_id: str, options: dict[str, Any]) -> Any:
        token = DECIDED.set(True)
        try:
            return send(task_id, options)
        finally:
            DECIDED.reset(token)
    return sending


def collapse_call(task: Any, args: Any, kwargs: Any, task_id: str | None,
                  options: dict[str, Any], send: Send) -> Any:
    """Send one call of *task* (``send(task_id, options)``), collapsed as its options say;
    the ``AsyncResult`` the caller gets. The per-call options :data:`OPTIONS` are taken out
    of *options*, each winning over the task's decorator default (``False`` turns
    ``flow_unique`` or ``flow_debounce`` off for the call); ``options["headers"]`` is the
    message's headers."""
    send = decided(send)
    given = {name: options.pop(name) for name in OPTIONS if name in options}
    if task.app.conf.task_always_eager:
        return send(task_id or uuid(), options)  # runs here and now: nothing to collapse
    headers = options["headers"]
    option = call_options(task, headers, given)
    retry = bool(options.get("retries"))
    spec = debounce_spec(task.name, option("flow_debounce"), option("flow_debounce_max"))
    if spec is not None and not retry and read_burst(headers) is None:
        return debounce_call(task.app, task.name, args, kwargs, options, spec,
                             option("debounce_key"), send, task.AsyncResult)
    unique = option("flow_unique")
    ukey = headers.get(UNIQUE_KEY_HEADER) or unique_key(task.name, unique, args, kwargs)
    if ukey is None:
        if given.get("flow_unique_keep") is not None and unique is None:
            unique_keep(task.name, given["flow_unique_keep"], None)  # refused: no flow_unique
        return send(task_id or uuid(), options)
    keep = unique_keep(task.name, option("flow_unique_keep"), unique or ukey)
    ttl = unique_ttl(task.name, option("flow_unique_ttl"), _max_hold(task, headers))
    task_id = task_id or uuid()
    if keep == LATEST:
        if not retry:  # the newest call wins (latestwins.py)
            return latest_call(task.app, task.name, ukey, task_id, ttl, options, send)
        # A retry is the same call: still the newest, unless a newer one came meanwhile,
        # which its run finds (and then it ends REVOKED).
        headers[UNIQUE_KEY_HEADER], headers[UNIQUE_KEEP_HEADER] = ukey, LATEST
        return send(task_id, options)
    holder = claim_unique(task.app, ukey, task_id, ttl)
    if holder != task_id and not retry:  # a retry is the same call, never a new one
        return task.AsyncResult(holder)
    headers[UNIQUE_KEY_HEADER] = ukey
    try:
        return send(task_id, options)
    except BaseException:
        claims_of(task.app).release("unique", ukey, task_id)  # never sent: nobody holds it
        raise


def call_options(task: Any, headers: dict[str, Any], given: dict[str, Any]) -> Callable[[str], Any]:
    """The collapse options of one call: ``option(name)`` is what the call gave (*given*),
    else its header (:data:`HEADERS`, taken out of *headers*: the message need not carry
    it on), else *task*'s decorator default (none when the task is not known here)."""
    sent = {name: headers.pop(header) for name, header in HEADERS.items() if header in headers}

    def option(name: str) -> Any:
        for source in (given, sent):
            value = source.get(name)
            if value is not None:
                return value
        return option_of(task, name) if task is not None else None

    return option


def claim_unique(app: Any, ukey: str, task_id: str, ttl: float) -> str:
    """Claim unique key *ukey* for *task_id*; the holder. A holder whose result has landed (a release
    the worker could not make: its process died, or the key lives in another process's
    memory) gives way at once."""
    claims = claims_of(app)
    holder = claims.claim("unique", ukey, task_id, ttl)
    if holder != task_id and _landed(app, holder):
        claims.release("unique", ukey, holder)
        holder = claims.claim("unique", ukey, task_id, ttl)
    return holder


def _landed(app: Any, task_id: str) -> bool:
    backend = app.backend
    # rpc:// keeps results as messages for the caller alone: asking would consume them.
    if not getattr(backend, "persistent", False) or type(backend).__name__ == "DisabledBackend":
        return False
    try:
        return bool(app.AsyncResult(task_id).ready())
    except Exception:  # no result backend, or it can't be read: trust the claim's TTL
        return False


def _max_hold(task: Any, headers: dict[str, Any]) -> float | None:
    name = headers.get(QUEUE_HEADER)
    if not isinstance(name, str):
        return None
    config = engines_of(task.app).config_of(name)
    return getattr(config, "max_hold", None)


def mark_duplicate(app: Any, task: Any, headers: dict[str, Any], body: Any) -> None:
    """``before_task_publish`` for a call sent by name (``send_task``) with the
    :data:`UNIQUE_HEADER` header or a unique task's default: claim its key, or, when another
    call holds it, make the message a duplicate of that call: Celery's ``send_task`` returns
    its own id and publishes anyway, so the message is renamed :data:`COLLAPSED_TASK`, which
    runs nothing and whose result names the call that runs."""
    if UNIQUE_KEY_HEADER in headers or "id" not in headers:
        return  # apply_async claimed already (or not a task message)
    spec = headers.pop(UNIQUE_HEADER, None)
    if spec is None:
        spec = option_of(task, "flow_unique")
    if spec in (None, False, "", 0):
        return
    if spec in ("1", 1, "true", "True"):
        spec = True
    name = str(headers.get("task") or getattr(task, "name", ""))
    args, kwargs = (body[0], body[1]) if isinstance(body, (list, tuple)) and len(body) >= 2 \
        else ((), {})
    ukey = unique_key(name, spec, args, kwargs)
    if ukey is None:
        return
    ttl = unique_ttl(name, option_of(task, "flow_unique_ttl"), None)
    task_id = str(headers["id"])
    keep = headers.pop(UNIQUE_KEEP_HEADER, None) or option_of(task, "flow_unique_keep")
    if unique_keep(name, keep, spec) == LATEST:
        headers[UNIQUE_KEY_HEADER], headers[UNIQUE_KEEP_HEADER] = ukey, LATEST
        previous, runner = latest_of(app).claim(ukey, task_id, ttl)
        if previous is not None:
            mark_replaced(app, previous, task_id, name)
            if runner == previous:
                revoke_run(app, previous)
        return
    holder = claim_unique(app, ukey, task_id, ttl)
    if holder == task_id:
        headers[UNIQUE_KEY_HEADER] = ukey
    else:
        headers[DUPLICATE_HEADER] = {"task_id": holder, "task": name}
        headers["task"] = COLLAPSED_TASK  # protocol 2: the name travels in the headers alone


class CaptureProducer(Producer):
    """A producer that keeps the one message Celery publishes through it, unsent."""

    captured: dict[str, Any] | None = None

    def publish(self, body: Any, routing_key: Any = None,  # type: ignore[override]
                **kwargs: Any) -> None:
        serializer = kwargs.get("serializer") or self.serializer or "json"
        content_type, content_encoding, data = dumps(body, serializer)
        headers = dict(kwargs.get("headers") or {})
        if kwargs.get("compression"):
            data, headers["compression"] = compress(data, kwargs["compression"])
        properties = {k: v for k, v in kwargs.items() if k not in NOT_PROPERTIES and v is not None}
        if properties.get("expiration") is not None:
            # Stored as kombu keeps it on a received message: milliseconds, a string.
            properties["expiration"] = str(int(float(properties["expiration"]) * 1000))
        exchange = kwargs.get("exchange")
        self.captured = {
            "body": data if isinstance(data, bytes) else str(data).encode(content_encoding),
            "content_type": content_type, "content_encoding": content_encoding,
            "headers": headers, "properties": properties,
            "exchange": getattr(exchange, "name", exchange) or "",
            "routing_key": routing_key or "",
        }


def capture(app: Any, name: str, task_id: str, options: dict[str, Any],
             send: Send) -> dict[str, Any]:
    """The message ``send`` would publish for *task_id*, built by Celery, not sent."""
    with app.producer_or_acquire(options.get("producer")) as real:
        producer = CaptureProducer(real.channel, auto_declare=False)
        send(task_id, {**options, "producer": producer})
    if producer.captured is None:
        raise CollapseError("Celery published nothing to park", name, "flow_debounce")
    return producer.captured


def debounce_call(app: Any, name: str, args: Any, kwargs: Any, options: dict[str, Any],
                  spec: DebounceSpec, key_spec: Any, send: Send,
                  result: Callable[[str], Any]) -> Any:
    """Park this call of task *name* as its burst's pending call, or put its arguments into
    the pending call of its burst (the burst of ``debounce_key`` *key_spec*); the burst's
    result, ``result(burst_id)`` (module docstring). *send* is how ``apply_async`` or
    ``send_task`` would publish the call: its message is captured, not sent."""
    dkey = debounce_key(name, key_spec, args, kwargs)
    claims, rows = claims_of(app), debounce_rows_of(app)
    own = uuid()
    message = capture(app, name, own, options, send)
    now = time.time()
    headers = {**message["headers"], BURST_HEADER: {"first": now, "calls": 1, "key": dkey}}
    later = {k: headers[k] for k in ("argsrepr", "kwargsrepr") if k in headers}

    def revise(merged: dict[str, Any]) -> float:
        burst = read_burst(merged) or {"first": now, "calls": 0, "key": dkey}
        if isinstance(merged.get(DEBOUNCE_HEADER), dict):
            del merged[DEBOUNCE_HEADER]  # the burst's other name (protocol.read_burst)
        burst["calls"] = int(burst.get("calls") or 0) + 1
        merged[BURST_HEADER] = burst
        due = wake_of(now, float(burst.get("first") or now), spec)
        merged["eta"] = eta_of(due)
        return due

    def join(burst: str) -> Any:
        """Put this call into pending *burst*; its result, or None if the burst fired."""
        moved = rows.replace(burst, message["body"], later, revise, now)
        if moved is None:
            # Gone, or on its way to the broker: it fired. This call starts the next burst
            # (the key is freed only if it still names the fired one).
            claims.release("debounce", dkey, burst)
            return None
        claims.extend("debounce", dkey, burst, moved - now + BURST_GRACE)
        if engines_of(app).settings.track_parked:
            row = rows.store.get(burst)  # its PARKED retry_at follows the deferral
            if row is not None:
                parked_by_producer(app, [row])
        return result(burst)

    # The common case inside a burst: one read of the key, one SQL transaction.
    current = claims.holder("debounce", dkey)
    joined = join(current) if current is not None else None
    if joined is not None:
        return joined
    wake = wake_of(now, now, spec)
    headers["eta"] = eta_of(wake)
    row = ParkedMessage(
        task_id=own, queue=str(headers.get(QUEUE_HEADER) or DEBOUNCE), body=message["body"],
        wake_at=wake, task_name=name, priority=int_or_zero(headers.get(PRIORITY_HEADER)),
        content_type=message["content_type"], content_encoding=message["content_encoding"],
        headers=headers, properties=message["properties"], exchange=message["exchange"],
        routing_key=message["routing_key"], reason=DEBOUNCE)
    rows.park(row)
    for _ in range(5):
        burst = claims.claim("debounce", dkey, own, wake - now + BURST_GRACE)
        if burst == own:
            parked_by_producer(app, [row])  # a burst of its own: PARKED, when tracked
            return result(own)
        joined = join(burst)
        if joined is not None:
            rows.discard(own)  # this call lives on in the burst's row
            return joined
    return result(own)  # parked and due: it runs, as a burst of its own


def eta_of(due: float) -> str:
    """The run's ``eta`` header: its due instant, as Celery writes one. A waker may claim a
    row a little before it is due (worker/waking.py); with its ETA the worker holds the run
    until then, so a burst never runs sooner than ``flow_debounce`` after its last call."""
    return datetime.fromtimestamp(due, timezone.utc).isoformat()


def int_or_zero(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
