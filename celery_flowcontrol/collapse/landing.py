"""The worker's side of calls that collapse: a unique unique_key is freed when the call's result lands.

Celery's own signals carry it, in the process where each happens: ``task_prerun`` (the run
starts: the unique_key is held on a short lease, ``flowcontrol_instance_ttl``, renewed by a thread
of the running process, so a killed node's keys free within that TTL, and for at most the
key's TTL, so a run stuck for good frees it too), ``task_postrun`` (success, failure: the key
is freed; a retry or a ``FlowBackoff`` keeps it, back on its full TTL, since either is the
same call going on), ``task_revoked`` (revoked, expired: freed). A redelivered run (its node
was killed) takes its key again if it is free, and never frees a key a later call took since.
A latest-wins call (``flow_unique_keep="latest"``) holds its key's run lease through
latestrun.py; a terminated or revoked one frees it here, on ``task_revoked``.
``send_task`` of this app is wrapped (sending.py) to return the first call's result without
sending; for a call sent by name from a producer without flow control, ``before_task_publish``
claims the key, and a duplicate becomes the task :data:`~.publish.COLLAPSED_TASK`, registered
here, which runs nothing and stores the state ``COLLAPSED`` with ``{"task_id": <the first
call's>, "task": <its name>}``.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from celery import signals, states
from celery.exceptions import Ignore

from ..engines import engines_of, unproxy
from ..errors import FlowControlError
from ..protocol import DUPLICATE_HEADER, QUEUE_HEADER, UNIQUE_HEADER, UNIQUE_KEY_HEADER
from ..task import FlowBackoff
from .keys import option_of, unique_ttl
from .latestwins import latest_key_of, mark_replaced
from .publish import COLLAPSED_TASK, DECIDED, mark_duplicate
from .sending import wrap_send_task
from .wiring import claims_of, latest_of

__all__ = ["UniqueLeases", "install_collapse"]

logger = logging.getLogger(__name__)

_INSTALLED: set[int] = set()
#: Apps with collapse installed, oldest first: ``before_task_publish`` does not say which app
#: publishes, so a call sent by name is claimed in the newest app that knows its task.
_APPS: list[weakref.ref[Any]] = []
_LOCK = threading.Lock()


class UniqueLeases:
    """The unique keys of the runs in this process, renewed on a lease until they land."""

    def __init__(self, app: Any, lease: float) -> None:
        self.app = app
        self.lease = lease
        self._keys: dict[str, tuple[str, float]] = {}  # task id -> (unique_key, renew until)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, unique_key: str, task_id: str, ttl: float) -> None:
        """A run of *task_id* starts: keep *unique_key* on the lease (take it again if it lapsed),
        renewed for at most *ttl* seconds (a run stuck for good frees its key, as a slot
        frees after ``max_hold``)."""
        holder = claims_of(self.app).claim("unique", unique_key, task_id, min(self.lease, ttl))
        if holder != task_id:
            return  # a later call took the key after this run's lapsed: it is theirs now
        with self._lock:
            self._keys[task_id] = (unique_key, time.monotonic() + ttl)
            if self._thread is None or not self._thread.is_alive():
                # Started here, in the process that runs tasks (after a prefork fork).
                self._thread = threading.Thread(target=self._renew, name="flowcontrol-unique",
                                                daemon=True)
                self._thread.start()

    def finish(self, unique_key: str, task_id: str, retry: bool, ttl: float) -> None:
        """The run of *task_id* ended: free *unique_key*, or (a retry) give it back its full TTL."""
        with self._lock:
            self._keys.pop(task_id, None)
        claims = claims_of(self.app)
        if retry:
            claims.extend("unique", unique_key, task_id, ttl)
        else:
            claims.release("unique", unique_key, task_id)

    def _renew(self) -> None:
        while True:
            self._wake.wait(self.lease / 3.0)
            now = time.monotonic()
            with self._lock:
                held = dict(self._keys)
                for task_id, (_, until) in held.items():
                    if until <= now:
                        del self._keys[task_id]  # its TTL is spent: the lease runs out
            for task_id, (unique_key, until) in held.items():
                if until <= now:
                    continue
                try:
                    claims_of(self.app).extend("unique", unique_key, task_id,
                                               min(self.lease, until - now))
                except Exception as exc:  # an outage: the next round tries again
                    logger.warning("flowcontrol: can't renew unique key of %s: %s", task_id, exc)


def _ttl_of(task: Any) -> float:
    """The unique TTL of a run of *task*: its ``flow_unique_ttl``, else its flow queue's
    ``max_hold``, else one hour (as at publish)."""
    queue = task.request.get(QUEUE_HEADER) or getattr(task, "flow_queue", None)
    config = engines_of(task.app).config_of(queue) if isinstance(queue, str) else None
    return unique_ttl(task.name, option_of(task, "flow_unique_ttl"),
                      getattr(config, "max_hold", None))


def _unique_key_of(request: Any) -> str | None:
    """The first-wins unique key a request holds (a latest-wins call's run holds its key's
    lease through latestrun.py instead)."""
    unique_key = getattr(request, UNIQUE_KEY_HEADER, None) if request is not None else None
    if latest_key_of(request) is not None:
        return None
    return unique_key if isinstance(unique_key, str) and unique_key else None


def _publishing(sender: Any = None, body: Any = None, headers: Any = None, **kw: Any) -> None:
    """``before_task_publish``: claim the key of a unique call sent by name, unless the call's
    collapsing was decided already (``apply_async``, or the wrapped ``send_task``): a call
    sent with ``flow_unique=False``, or captured for a debounced burst, claims nothing."""
    if DECIDED.get() or not isinstance(headers, dict) or UNIQUE_KEY_HEADER in headers or \
            not isinstance(sender, str):
        return
    for ref in reversed(_APPS):
        app = ref()
        task = app.tasks.get(sender) if app is not None else None
        if task is not None:
            if UNIQUE_HEADER in headers or option_of(task, "flow_unique"):
                mark_duplicate(app, task, headers, body)
            return


def install_collapse(app: Any) -> None:
    """Connect the signals of the module docstring for *app* in this process (idempotent)."""
    app = unproxy(app)
    with _LOCK:
        if id(app) in _INSTALLED:
            return
        _INSTALLED.add(id(app))
    uid = f"flowcontrol-collapse-{id(app)}"
    leases: list[UniqueLeases] = []

    def ours(task: Any) -> bool:
        return task is not None and unproxy(getattr(task, "app", None)) is app

    def unique_leases() -> UniqueLeases:
        if not leases:
            leases.append(UniqueLeases(app, engines_of(app).settings.instance_ttl))
        return leases[0]

    def prerun(sender: Any = None, task_id: Any = None, task: Any = None, **kw: Any) -> None:
        task = task or sender
        unique_key = _unique_key_of(getattr(task, "request", None)) if ours(task) else None
        if unique_key is not None:
            try:
                unique_leases().start(unique_key, str(task_id), _ttl_of(task))
            except FlowControlError as exc:
                logger.warning("flowcontrol: can't claim unique key of %s: %s", task_id, exc)

    def postrun(sender: Any = None, task_id: Any = None, task: Any = None, state: Any = None,
                retval: Any = None, **kw: Any) -> None:
        task = task or sender
        unique_key = _unique_key_of(getattr(task, "request", None)) if ours(task) else None
        if unique_key is not None:
            # A retry, or a FlowBackoff (parked, then run again with its id), goes on: the
            # same call keeps its key.
            again = state == states.RETRY or isinstance(retval, FlowBackoff)
            unique_leases().finish(unique_key, str(task_id), again, _ttl_of(task))

    def revoked(sender: Any = None, request: Any = None, **kw: Any) -> None:
        if not ours(sender):
            return
        task_id = str(getattr(request, "id", ""))
        unique_key = _unique_key_of(request)
        if unique_key is not None:
            claims_of(app).release("unique", unique_key, task_id)
        latest = latest_key_of(request)
        if latest is not None:
            # Terminated or discarded unrun: its run's lease frees here (a terminated pool
            # process frees nothing), and a call a newer one replaced gets back the meta
            # naming it, which Celery's own REVOKED ("terminated") overwrote.
            try:
                successor = latest_of(app).finish(latest, task_id)
            except Exception as exc:  # an outage: the lease lapses by itself
                logger.warning("flowcontrol: can't free the latest-wins key of %s: %s",
                               task_id, exc)
                return
            if successor is not None:
                mark_replaced(app, task_id, successor, getattr(sender, "name", ""))

    wrap_send_task(app)  # send_task returns the first call's result (sending.py)
    _APPS.append(weakref.ref(app))
    signals.before_task_publish.connect(_publishing, weak=False,
                                        dispatch_uid="flowcontrol-collapse-publish")
    @app.task(name=COLLAPSED_TASK, bind=True, shared=False)
    def collapsed(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            self.update_state(state="COLLAPSED", meta=self.request.get(DUPLICATE_HEADER))
        except NotImplementedError:
            pass  # no result backend: nothing to say, and nothing runs either way
        raise Ignore()

    signals.task_prerun.connect(prerun, weak=False, dispatch_uid=f"{uid}-prerun")
    signals.task_postrun.connect(postrun, weak=False, dispatch_uid=f"{uid}-postrun")
    signals.task_revoked.connect(revoked, weak=False, dispatch_uid=f"{uid}-revoked")
