"""``FlowTask``: the task base class that opts a task into flow control.

Usage::

    @app.task(base=FlowTask, flow_queue="partner-api", flow_priority=0)
    def call_partner(order_id): ...

    call_partner.apply_async((42,), flow_priority=5, fairness_key="tenant-7")

``flow_cost`` is what one admission charges the queue's ``per="cost"`` rate limits (default
1): a number, per call or as a decorator default, or a callable ``(args, kwargs) -> number``
evaluated at publish; ``fairness_key`` takes such a callable too (returning text). A bad
value, a callable that raises, or a cost no limit of the queue can ever admit is refused
right there (a :class:`FlowControlError` naming the task, the queue and the field), and
nothing is sent.

The options travel as message headers (``flow_queue``, ``flow_priority``,
``flow_fairness_key``, ``flow_cost``, ``flow_label``), so retries, chains, chords and
``send_task`` carry them; the worker reads them back before the task takes a pool slot.
Celery's own ``queue=`` and ``priority=`` keep their meaning.

A FlowTask keeps its place among plain tasks: it is published with the broker priority plain
Celery would give it (the caller's ``priority=``, else the task's or ``task_default_priority``,
else none), so in a broker queue it shares with plain tasks it is fetched in the order sent.
``flow_priority`` orders waiters in admission (docs/celery.md, "The order a task gets"); only a
woken message is moved ahead in the broker (worker/message.py).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from celery import Task
from celery.exceptions import Ignore
from kombu.utils.imports import symbol_by_name

from .call_checks import (
    check_cost,
    check_flow_options,
    check_key,
    check_queue_known,
    default_of,
    evaluate,
)
from .collapse.batching import BATCH_HEADER, check_batch_task, publish_batched
from .collapse.keys import option_of, unique_keep
from .collapse.latestwins import latest_key_of
from .collapse.publish import collapse_call
from .compat import push_request
from .config import QueueConfig
from .errors import FlowControlConfigError, FlowControlError
from .protocol import (
    COST_HEADER,
    KEY_HEADER,
    LABEL_HEADER,
    PRIORITY_HEADER,
    QUEUE_HEADER,
    REQUEST_KEYS,
    has_fairness_key,
)
from .room import check_room


class FlowBackoff(FlowControlError, Ignore):
    """Raised by a task body when the downstream pushed back (a 429 saying "not before 30 s"):
    the task's flow queue admits nothing for *retry_after* seconds, fleet-wide (or, with
    ``scope="key"``, nothing of the task's ``fairness_key``); the task's slot is released and
    the task is parked and run again when the backoff is over. Not a Celery retry (its
    ``retries`` stay as they were) and not a failure: it is a Celery ``Ignore`` (no result is
    stored), which the worker's request turns into a park until the backoff ends
    (``worker/backoff.py``)::

        except RateLimited as exc:
            raise FlowBackoff(exc.retry_after)

    *retry_after* is seconds (a number, or a numeric string as an HTTP ``Retry-After``
    header gives it), more than 0 and at most a day; else :class:`FlowControlConfigError`.
    """

    #: The longest backoff one call may ask for (a figure past a day is a bug, not a quota).
    MAX = 86_400.0
    SCOPES = ("queue", "key")

    def __init__(self, retry_after: float | str, scope: str = "queue") -> None:
        seconds: float | None = None
        if isinstance(retry_after, (int, float)) and not isinstance(retry_after, bool):
            seconds = float(retry_after)
        elif isinstance(retry_after, str):
            try:
                seconds = float(retry_after.strip())
            except ValueError:
                seconds = None
        if seconds is None or not 0 < seconds <= self.MAX:  # NaN fails too
            raise FlowControlConfigError(
                f"must be seconds > 0 and at most {self.MAX:g}, got {retry_after!r}", None,
                "retry_after")
        if scope not in self.SCOPES:
            raise FlowControlConfigError(f"must be 'queue' or 'key', got {scope!r}", None,
                                         "scope")
        super().__init__(seconds, scope)
        self.retry_after = seconds
        self.scope = scope

    def __str__(self) -> str:
        what = "the flow queue" if self.scope == "queue" else "the task's fairness key"
        return f"backoff: {what} admits nothing for {self.retry_after:g} s"


class FlowTask(Task):
    """Base class of a flow-controlled task (see the module docstring)."""

    Strategy = "celery_flowcontrol.worker.strategy:flow_strategy"
    Request = "celery_flowcontrol.worker.request:FlowRequest"
    #: The worker's side of a flow_batch batch's run and of a latest-wins call's, by name too.
    BatchRun = "celery_flowcontrol.collapse.batchrun:run"
    LatestRun = "celery_flowcontrol.collapse.latestrun:run_latest"
    push_request = push_request  # Task.__call__, which __call__ calls, keeps the request (compat)

    #: The flow queue this task is admitted through; ``None``: ungated unless a call says.
    flow_queue: str | None = None
    #: Admission priority among waiters, higher first.
    flow_priority: int = 0
    #: Fairness key for ``fairness="key"`` queues, or a callable ``(args, kwargs) -> str``
    #: evaluated at publish; default: the task's root id.
    fairness_key: Any = None
    #: What one admission charges ``per="cost"`` rate limits: a number, or a callable
    #: ``(args, kwargs) -> number`` evaluated at publish; default 1.
    flow_cost: Any = None
    #: Shown next to the slot by the CLI and the dashboard: text, or a callable ``(args,
    #: kwargs) -> str`` evaluated at publish.
    flow_label: Any = None
    #: Run one at a time in arrival order, fleet-wide: a concurrency-1 FIFO flow queue named
    #: after the task (``serial.<name>``), with no config.
    serial: bool = False
    #: Calls that collapse (docs/collapse.md): ``True`` (key: the arguments) or a callable
    #: ``(args, kwargs) -> str``; while a call of a key waits or runs, another returns its id.
    flow_unique: Any = None
    #: Longest a unique key is held (default: the flow queue's ``max_hold``, else 1 h).
    flow_unique_ttl: Any = None
    #: Which call of a unique key wins: ``"first"`` (default: later calls get its result) or
    #: ``"latest"`` (a newer call replaces a waiting one and revokes a running one).
    flow_unique_keep: Any = None
    #: A burst of calls runs once, this long after the last call, with its arguments.
    flow_debounce: Any = None
    #: Longest a busy stream of calls defers a debounced run, from the burst's first call.
    flow_debounce_max: Any = None
    #: A callable ``(args, kwargs) -> str`` splitting debounce bursts; default: the task name.
    debounce_key: Any = None
    #: Calls run together (docs/collapse.md): ``{"size": 64, "wait": "2s", "key": callable}``;
    #: the task then takes ``list[BatchCall]``.
    flow_batch: Any = None

    def apply_async(self, args: Any = None, kwargs: Any = None, task_id: Any = None,
                    producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: Any = None, **options: Any) -> Any:
        """Like :meth:`celery.Task.apply_async`, plus the flow options below. Each is also
        a decorator default (``@app.task(base=FlowTask, flow_queue=...)``); one given here
        wins for this call. The first five travel as headers (named in parentheses), which
        ``send_task`` and other producers can set themselves (docs/settings.md).

        :param flow_queue: the flow queue that gates this call (``flow_queue``).
        :param flow_priority: int, higher first, -1,000,000..1,000,000; also mapped onto the
            broker's priority when ``priority`` is not given (``flow_priority``).
        :param fairness_key: the tenant ``fairness="key"`` queues are fair across, a str of
            at most 256 UTF-8 bytes or a callable ``(args, kwargs) -> str``; default: the
            task's root id (``flow_fairness_key``).
        :param flow_cost: what one admission charges ``per="cost"`` rate limits, a number
            > 0 or a callable ``(args, kwargs) -> number``; default 1 (``flow_cost``).
        :param flow_label: text shown next to the slot by the CLI and the dashboard, or a
            callable ``(args, kwargs) -> str`` (``flow_label``).
        :param serial: ``True``: admitted through the task's own concurrency-1 FIFO queue
            (``serial.<name>``, sent as its ``flow_queue``); ``False``: not, for this call.
        :param flow_unique: ``True`` (the arguments are the key), a callable ``(args,
            kwargs) -> str`` or a str key: while a call of that key waits or runs, this
            call returns its ``AsyncResult`` and sends nothing; ``False``: not unique this
            time (docs/collapse.md).
        :param flow_unique_ttl: the longest a unique key is held (default: the queue's
            ``max_hold``, else 1 h).
        :param flow_unique_keep: ``"first"`` (the default: the call that holds the key
            wins) or ``"latest"``: this call replaces the key's waiting call and revokes
            its running one (``terminate=True``), which end REVOKED naming this call; two
            runs of the key never overlap (docs/collapse.md).
        :param flow_debounce: a duration (``"5s"``): the call joins its burst, which runs
            once, this long after its last call, with the last call's arguments; every
            call returns the burst's ``AsyncResult``. ``False``: sent now, not debounced.
        :param flow_debounce_max: the longest a busy burst is deferred, from its first call.
        :param debounce_key: which burst the call belongs to: a str, or a callable ``(args,
            kwargs) -> str``; default: one burst per task name.
        :raises InvalidTicketError: a bad queue name, priority or fairness key.
        :raises CostRefusedError: a cost that no limit of the queue can ever admit.
        :raises FlowQueueFull: a full ``max_waiting`` of the queue or the call's key, seen
            at publish (docs/tenants.md); nothing is sent.
        :raises CollapseError: a bad collapse option, or a key callable that fails.
        """
        headers = dict(options.get("headers") or {})
        queue = options.pop("flow_queue", None)
        priority = options.pop("flow_priority", None)
        key = options.pop("fairness_key", None)
        cost = options.pop("flow_cost", None)
        label = options.pop("flow_label", None)
        serial = options.pop("serial", None)
        if queue is None and serial:
            queue = serial_config(self.name).name
        if callable(key):
            named = queue or self.flow_queue
            key = check_key(self, named, evaluate(self, "fairness_key", key, args, kwargs, named))
        check_flow_options(queue, priority, key)
        if label is None and LABEL_HEADER not in headers:
            label = default_of(self, "flow_label")
        if label is not None:
            named = queue or self.flow_queue
            headers[LABEL_HEADER] = str(evaluate(self, "flow_label", label, args, kwargs, named))
        # Explicit options win; then what the message already carries (a retry); then the
        # decorator defaults.
        if queue is not None:
            headers[QUEUE_HEADER] = queue
        elif QUEUE_HEADER not in headers and (self.flow_queue or (
                self.serial if serial is None else serial)):
            headers[QUEUE_HEADER] = self.flow_queue or serial_config(self.name).name
        if queue is not None or (self.flow_queue and headers.get(QUEUE_HEADER) == self.flow_queue):
            check_queue_known(self, headers[QUEUE_HEADER])
        if priority is not None:
            headers[PRIORITY_HEADER] = priority
        elif self.flow_priority and PRIORITY_HEADER not in headers:
            headers[PRIORITY_HEADER] = self.flow_priority
        where = headers.get(QUEUE_HEADER)
        if key is not None:
            headers[KEY_HEADER] = key
        elif self.fairness_key and not has_fairness_key(headers):
            default = default_of(self, "fairness_key")
            if callable(default):
                default = check_key(self, where, evaluate(self, "fairness_key", default, args,
                                                          kwargs, where))
            headers[KEY_HEADER] = default
        if cost is None and COST_HEADER not in headers:
            cost = default_of(self, "flow_cost")
        if cost is not None:
            headers[COST_HEADER] = check_cost(
                self, where, evaluate(self, "flow_cost", cost, args, kwargs, where))
        check_room(self.app, where, headers.get(KEY_HEADER))  # FlowQueueFull (room.py)
        options["headers"] = headers

        def send(tid: str, opts: dict[str, Any]) -> Any:
            opts = dict(opts)
            via = opts.pop("producer", None) or producer
            return super(FlowTask, self).apply_async(args, kwargs, tid, via, link, link_error,
                                                     shadow, **opts)

        def send_empty(tid: str, opts: dict[str, Any]) -> Any:  # a batch's own message
            opts = dict(opts)
            via = opts.pop("producer", None) or producer
            return super(FlowTask, self).apply_async((), {}, tid, via, None, None, shadow, **opts)

        parked = publish_batched(self, args, kwargs, task_id, options, send, send_empty)
        if parked is not None:  # flow_batch (collapse/batching.py)
            return parked
        # flow_unique / flow_debounce (collapse/publish.py): may return another call's result.
        return collapse_call(self, args, kwargs, task_id, options, send)

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Check the task's ``flow_batch`` and ``flow_unique_keep`` as it is made."""
        super().on_bound(app)
        check_batch_task(cls)
        keep = option_of(cls, "flow_unique_keep")
        if keep is not None:
            unique_keep(cls.name, keep, option_of(cls, "flow_unique"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        header = getattr(self.request, BATCH_HEADER, None)
        if header is None:
            header = (getattr(self.request, "headers", None) or {}).get(BATCH_HEADER)
        if isinstance(header, dict) and not args and not kwargs:
            return symbol_by_name(self.BatchRun)(self, header)
        latest = latest_key_of(self.request)
        if latest is not None:  # flow_unique_keep="latest" (collapse/latestrun.py)
            return symbol_by_name(self.LatestRun)(
                self, latest, lambda: super(FlowTask, self).__call__(*args, **kwargs))
        return super().__call__(*args, **kwargs)

    def signature_from_request(self, request: Any = None, *args: Any, **kwargs: Any) -> Any:
        """As Celery's (retries use it), without what the worker handed this run."""
        sig = super().signature_from_request(request, *args, **kwargs)
        headers = sig.options.get("headers")
        if headers:
            sig.options["headers"] = {k: v for k, v in headers.items() if k not in REQUEST_KEYS}
        return sig


def stamp_headers(app: Any, sender: Any, headers: dict[str, Any] | None) -> None:
    """Give a FlowTask of *app* sent by name (``send_task``, beat) its decorator defaults, as
    ``apply_async`` does (the ``before_task_publish`` hook of worker/runtime.py)."""
    task = app.tasks.get(sender) if isinstance(sender, str) else None
    if headers is None or task is None or QUEUE_HEADER in headers:
        return
    queue = getattr(task, "flow_queue", None)
    if not queue:
        return
    headers[QUEUE_HEADER] = queue
    if getattr(task, "flow_priority", 0):
        headers.setdefault(PRIORITY_HEADER, task.flow_priority)
    # A callable default needs the call's arguments: by name, only apply_async has them.
    if getattr(task, "fairness_key", None) and not callable(task.fairness_key) and not \
            has_fairness_key(headers):
        headers[KEY_HEADER] = task.fairness_key
    cost = getattr(task, "flow_cost", None)
    if cost is not None and not callable(cost):
        headers.setdefault(COST_HEADER, cost)
    label = getattr(task, "flow_label", None)
    if label is not None and not callable(label):
        headers.setdefault(LABEL_HEADER, str(label))


def serial_config(task_name: str) -> QueueConfig:
    """The concurrency-1 FIFO queue of a ``serial=True`` task."""
    name = re.sub(r"[^a-z0-9._-]", "-", task_name.lower())
    if name != task_name or len(name) > 57:
        # Keep distinct task names apart after lower-casing and trimming.
        name = f"{name[:48]}-{hashlib.sha1(task_name.encode()).hexdigest()[:8]}"
    return QueueConfig(f"serial.{name}", concurrency=1)
