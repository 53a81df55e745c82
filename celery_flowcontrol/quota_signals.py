"""What a running task tells its quotas: ``settle_cost`` and ``backoff``.

A flow queue's ``per="cost"`` limits are charged a task's estimated cost (``flow_cost``)
when it is admitted; once the task knows the true figure (the tokens an LLM call used), it
settles::

    @app.task(base=FlowTask, bind=True, flow_queue="openai",
              flow_cost=lambda args, kwargs: estimate_tokens(kwargs["prompt"]))
    def complete(self, prompt):
        reply = client.chat(prompt)
        settle_cost(reply.usage.total_tokens)
        return reply.text

The correction is made at once, in the backend, fleet-wide (the admission backend module
``admission/settling.py`` says why at once and not with the release). ``backoff(app, queue,
seconds)`` pauses a queue from any process (a webhook saying the quota is spent); a task
body raises :class:`~celery_flowcontrol.task.FlowBackoff` instead.
"""

from __future__ import annotations

from typing import Any

from celery import current_app

from .admission.quota import check_actual
from .errors import FlowControlError, SettleError


def settle_cost(actual: float, *, app: Any = None) -> float:
    """Correct the cost this running task's admission charged to *actual*, in every
    ``per="cost"`` rate limit of its flow queue (and of its key's windows), as if *actual*
    had been charged at admission; returns ``actual - charged``. A refund is room waiters
    may use at once (one is woken); an overdraft pushes later admissions out.

    :param actual: the true cost, a finite number >= 0 (0 gives the whole charge back).
    :param app: the Celery app (default: the current one).
    :raises SettleError: outside a FlowTask run by a worker, in a run that holds no slot (its
        flow queue is not registered), a second time for one admission, or for a value that
        is not a finite number >= 0. Nothing is changed then.
    """
    from .flowcontrol import FlowControl
    from .task import FlowTask

    app = app or current_app
    task = app.current_task  # the task running on this thread, or None
    if task is None or task.request.called_directly or not isinstance(task, FlowTask):
        raise SettleError("settle_cost() must be called inside a FlowTask run by a worker")
    request = task.request
    slot = getattr(request, "flow_slot", None)
    if not slot:
        raise SettleError(f"settle_cost(): this run of {task.name} holds no slot (its flow "
                          "queue is not registered, or it ran ungated)")
    actual = check_actual(slot, actual)
    if getattr(request, "flow_settled", False):
        raise SettleError("was settled already: settle_cost is once per admission", slot)
    try:
        delta = FlowControl(app).call_backend("settle", slot_id=slot, actual=actual)
    except SettleError:
        raise
    except FlowControlError as exc:  # through a worker's remote control: the error as text
        if str(exc).startswith("SettleError: "):
            raise SettleError(str(exc)[len("SettleError: "):]) from None
        raise
    request.flow_settled = True
    return float(delta)


def backoff(app: Any, queue: str, seconds: float, key: str | None = None) -> float:
    """Admit nothing of flow queue *queue* (or, with *key*, of that ``fairness_key``) for
    *seconds*, fleet-wide; returns the instant the backoff in force ends (a shorter backoff
    does not shorten a longer one). A queue backoff halves each ``adaptive`` limit.

    :param app: the Celery app.
    :param queue: the flow queue's name.
    :param seconds: more than 0, at most a day.
    :param key: a fairness key, to pause only its tasks.
    :raises FlowControlConfigError: for *seconds* out of range or a bad key.
    :raises UnknownQueueError: for a queue nobody registered.
    """
    from .flowcontrol import FlowControl

    return float(FlowControl(app).call_backend("backoff", queue=queue, seconds=seconds, key=key))


__all__ = ["backoff", "settle_cost"]
