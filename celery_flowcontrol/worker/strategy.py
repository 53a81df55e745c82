"""The strategy wrapper: admission before the pool.

``FlowTask.Strategy`` points here. Celery calls the strategy for every message of the task
on the consumer's loop; we ask the gate first and hand the message to Celery's default
strategy only when it may run now. A parked message never reaches the pool, the timer or
the reserved-requests list, so it costs the worker no memory. A lingering one (linger.py) waits
unacked in the prefetch window, as a prefetched message would, until its grant comes.

On the event loop the gate may answer later (``Outcome.ASKED``: the admission call is on its
way, admission/redis/loop.py), so the loop goes on meanwhile; the outcome then comes to ``later``. A
message decided outside Celery's ``on_task_received`` (on a reply, a timer or a grant) gets
Celery's handling of a bad message here: an invalid or undecodable one is rejected as
Celery would, never left unacked. Every decision of one delivery (the first, a retry, a
resume, a reply) shares one :class:`~.delivery.DeliveryState`: the delivery is decided and
acked once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from celery.exceptions import InvalidTaskError
from celery.worker import state as worker_state
from celery.worker.strategy import default
from kombu.exceptions import ContentDisallowed, DecodeError, MessageStateError

from .delivery import DeliveryState, Outcome
from .runtime import installed
from .runtime_registry import runtime_of

logger = logging.getLogger(__name__)

#: How long a message waits before it is tried again while a service is unreachable.
DEFER_DELAY = (0.5, 1.0, 2.0, 5.0)


def acker_of(ack: Any, connection_errors: tuple[type[BaseException], ...]) -> Callable[[], Any]:
    """How the gate acks a delivery: Celery's *ack* (kombu's ``Message.ack_log_error``, queued
    on the consumer's loop), with a message found acked already logged, not raised: raised
    on the loop, kombu's ``MessageStateError`` stops the worker with every message it holds."""
    return functools.partial(ack, logger, (*connection_errors, MessageStateError))


def flow_strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Any:
    """Build the message handler of *task* for *consumer* (Celery's strategy signature)."""
    inner = default(task, app, consumer, **kwargs)
    if not installed(app):
        logger.warning("flowcontrol: FlowControl(app) was not called; task %s runs ungated",
                       task.name)
        return inner
    timer = consumer.timer
    connection_errors = consumer.connection_errors

    def handler(message: Any, body: Any, ack: Any, reject: Any, callbacks: Any,
                attempt: int = 0, may_hold: bool = True, state: DeliveryState | None = None,
                **kw: Any) -> Any:
        runtime = runtime_of(app)
        headers = message.headers or {}
        if runtime is None:
            return inner(message, body, ack, reject, callbacks, **kw)
        gate = runtime.gate
        acker = acker_of(ack, connection_errors)
        if headers.get("id") in worker_state.revoked:
            # A revoked waiter leaves its lines (a grant it holds passes on); Celery then
            # discards the message as usual.
            gate.withdraw(message, task)
            return inner(message, body, ack, reject, callbacks, **kw)

        # One per delivery, handed to every later decision of it (delivery.py).
        state = state if state is not None else DeliveryState()

        def run(outcome: Outcome) -> Any:
            if outcome is Outcome.RUN:  # the common case first
                try:
                    return inner(message, body, ack, reject, callbacks, **kw)
                except BaseException:
                    # Celery refused the message (invalid, undecodable): it will never finish.
                    runtime.releaser.finish(str(headers.get("id")), message.delivery_tag)
                    raise
            if outcome is Outcome.DEFER:
                delay = DEFER_DELAY[min(attempt, len(DEFER_DELAY) - 1)]
                timer.call_after(delay, outside, (message, body, ack, reject, callbacks,
                                                  attempt + 1, True, state))
                return None
            if outcome is not Outcome.UNGATED:  # parked, lingering, asked or decided already
                return None
            return inner(message, body, ack, reject, callbacks, **kw)  # UNGATED

        # Lingering, it is decided again when its grant comes or its linger bound passes; then it may run
        # or park, but does not linger a second time.
        resume = (lambda: outside(message, body, ack, reject, callbacks, 0, False, state, **kw)) \
            if may_hold else None
        # A fresh delivery may be decided later, on the reply (the loop goes on meanwhile);
        # a lingering waiter coming back with its grant, or a retry, is decided now: it is the
        # hand-over of a moving line, which another turn of the loop would only delay.
        later = (lambda outcome: as_celery(lambda: run(outcome), body, message)) \
            if may_hold and not attempt else None
        try:
            outcome = gate.on_message(message, task, acker, resume, later, state)
        except Exception:
            # A bug must not crash the worker nor lose the message: it stays unacked and is
            # tried again later (logged each time, so it is seen).
            logger.exception("flowcontrol: admission of task %s failed; retrying later",
                             headers.get("id"))
            outcome = Outcome.DEFER
        return run(outcome)

    def outside(message: Any, body: Any, *args: Any, **kw: Any) -> Any:
        """*handler*, called from a timer or a grant, not from Celery's on_task_received."""
        return as_celery(lambda: handler(message, body, *args, **kw), body, message)

    def as_celery(call: Callable[[], Any], body: Any, message: Any) -> Any:
        """*call*, with what Celery's on_task_received does when a strategy raises these."""
        try:
            return call()
        except (InvalidTaskError, ContentDisallowed) as exc:
            return consumer.on_invalid_task(body, message, exc)
        except DecodeError as exc:
            return consumer.on_decode_error(message, exc)

    return handler
