"""``FlowRequest``: releases a message's slot when its result lands, whatever the result.

Every way a request finishes in the main worker process passes through one of these hooks:

===============================  =======================================================
path                             hook
===============================  =======================================================
success                          ``on_success`` (wrapped in every subclass, see below)
failure, retry, reject, ignore   ``on_failure`` (a retry is admitted again as a new ticket;
                                 a ``FlowBackoff`` is parked until due first: backoff.py)
hard time limit, worker lost     ``on_failure`` (TimeLimitExceeded, WorkerLostError)
revoke with terminate            ``on_failure`` (Terminated)
revoked before it started        ``revoked`` (returns True once announced)
cancelled on connection loss     ``cancel``
dropped unrun on a reconnect     none: ``Releaser.finish_dropped`` asks ``will_finish``
===============================  =======================================================

Celery's ``create_request_cls`` subclasses the task's Request class on the fly and overrides
``on_success`` without calling ``super()`` (Celery issue #4526), so a plain override would
never run. ``__init_subclass__`` wraps the ``on_success`` of every subclass instead; no
Celery code is patched.
"""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.request import Request

from .backoff import backoff_of, park_after_backoff
from .message import WOKEN_HEADER, restore_priority
from .runtime_registry import runtime_of


def _release(request: Any) -> None:
    runtime = runtime_of(request.app)
    if runtime is not None:
        runtime.releaser.finish(str(request.id), request.message.delivery_tag)


def _releasing(on_success: Any) -> Any:
    @functools.wraps(on_success)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The slot first, then Celery's own handling (a late ack is a broker round trip): the
        # next waiter's grant goes out that much sooner. A crash in between redelivers a
        # finished task, as a crash before Celery's late ack always could.
        try:
            _release(self)
        finally:
            result = on_success(self, *args, **kwargs)
        return result

    wrapper._flowcontrol_releases = True  # type: ignore[attr-defined]
    return wrapper


class FlowRequest(Request):
    """The Request class of :class:`~celery_flowcontrol.FlowTask` (module docstring)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("on_success")
        if own is not None and not getattr(own, "_flowcontrol_releases", False):
            cls.on_success = _releasing(own)

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(message, *args, **kwargs)
        if WOKEN_HEADER in self.request_dict:
            # Woken from the parking table first in line: the task (and a retry of it, which
            # reads delivery_info) sees the priority it was sent with (worker/message.py).
            request = self.request_dict
            request["properties"] = restore_priority(request, self.delivery_info,
                                                     request.get("properties") or {})
        # Hand the task what admission gave it, as ``self.request.flow_*``; always set, so a
        # stale value carried in a republished message's headers can't leak through.
        runtime = runtime_of(self.app)
        admission = runtime.ledger.get((str(self.id), message.delivery_tag)) if runtime else None
        if admission is None:
            self._request_dict.update(flow_instance=runtime.instance if runtime else None,
                                      flow_slot=None, flow_admitted_at=None, flow_acquired={},
                                      flow_acquire_expired=[], flow_acquire_unknown=[])
            return
        admission.request = self
        entries = admission.entries
        self._request_dict.update(
            flow_instance=runtime.instance, flow_slot=admission.primary,
            # When admission let it run (the backend's clock): the task can measure its
            # wait, and rate limits hold exactly on these instants (start times add pool
            # jitter).
            flow_admitted_at=entries[0].slot.acquired_at if entries else None,
            flow_acquired=dict(admission.acquired), flow_acquire_expired=list(admission.expired),
            flow_acquire_unknown=list(admission.unknown))

    def on_failure(self, exc_info: Any, send_failed_event: bool = True,
                   return_ok: bool = False) -> Any:
        backoff = backoff_of(exc_info)  # FlowBackoff: park until due (backoff.py)
        if backoff is not None and not park_after_backoff(self, backoff, lambda: _release(self)):
            return None  # given back to the broker: not acked
        try:
            return super().on_failure(exc_info, send_failed_event=send_failed_event,
                                      return_ok=return_ok)
        finally:
            _release(self)

    def revoked(self) -> bool:
        revoked = super().revoked()
        if revoked:
            _release(self)
        return bool(revoked)

    def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> Any:
        try:
            return super().cancel(pool, signal=signal, emit_retry=emit_retry)
        finally:
            _release(self)


FlowRequest.on_success = _releasing(Request.on_success)
