"""Why a task waits: where a task is, what holds it and its place in line (``explain``).

A fixed number of reads, never one per waiter: the result backend (a task that ended, or
STARTED), the parking table (its row, by task id), and in the admission backend the queue's
figures, its grants and the task's place in line (``place``, in the order ``waiters`` lists
and admission serves). Only a task found in none of them costs a question to the workers
(remote control, bounded by *timeout*): lingering, or admitted there. A task nobody has seen
is ``unseen``, never an error: it may still be in the broker, or the id was never sent.
"""

from __future__ import annotations

from typing import Any

from ..admission.release_rate import RELEASE_TAU
from ..admission.values import QueueStats
from ..collapse.wiring import claims_of
from ..errors import FlowControlError
from ..parking.batches import gathering
from ..protocol import acquire_ticket, task_id_of, ticket_id
from ..reasons import Reason, reason_of
from .clock import backend_now
from .explain_text import blocked_by, sentence

__all__ = ["WHERE", "explain", "explain_task"]

#: Every place a task can be, as ``explain``'s ``where`` says it.
WHERE = ("unseen", "lingering", "parked", "granted", "running", "finished")
_READY = frozenset({"SUCCESS", "FAILURE", "REVOKED", "REJECTED", "IGNORED"})


def explain(app: Any, task_id: str, *, timeout: float = 1.0) -> dict[str, Any]:
    """Where task *task_id* is and why it waits, as one JSON-ready dict.

    :param app: the Celery app whose flow control to read.
    :param task_id: the task's id (an ``AsyncResult.id``).
    :param timeout: how long the workers may take to answer, when only they can tell (a
        task lingering in one, or admitted there); seconds.
    :returns: ``task_id``, ``where`` (one of :data:`WHERE`), ``queue``, ``key``, ``reason``
        (one of :data:`~celery_flowcontrol.reasons.REASONS`, or ``None``), ``position``,
        ``waiting``, ``ahead``, ``blocked_by``, ``retry_at``, ``estimated_start`` (with
        ``release_rate``, the queue's slots given back per second lately, for a concurrency
        wait), ``worker``,
        ``state`` (the result backend's) and ``text``: one sentence (docs/operators.md, "Why
        is my task waiting?").
    """
    from ..flowcontrol import FlowControl

    return explain_task(FlowControl(app), str(task_id), timeout=timeout)


def explain_task(fc: Any, task_id: str, *, timeout: float = 1.0) -> dict[str, Any]:
    """:func:`explain` through a :class:`~celery_flowcontrol.FlowControl` facade *fc*."""
    now = backend_now(fc)
    out: dict[str, Any] = {
        "task_id": task_id, "where": "unseen", "queue": None, "key": None, "reason": None,
        "position": None, "waiting": None, "ahead": None, "blocked_by": [], "retry_at": None,
        "estimated_start": None, "worker": None, "state": _state(fc.app, task_id), "now": now}
    if out["state"] in _READY:
        out["where"] = "finished"
    else:
        row = fc.store.get(task_id)
        if row is not None:
            out.update(where="parked", queue=row.queue, key=row.fairness_key,
                       retry_at=row.wake_at, parked_at=row.parked_at)
            said = reason_of(row.reason)
            out["reason"] = said.value if said is not None else row.reason
            if row.queue.startswith(gathering("")):
                # A call of a flow_batch task: it runs with its batch, when that is due.
                out["retry_at"] = _batch_due(fc, row.queue[len(gathering("")):])
            _in_line(fc, out, now, _tickets(task_id, row.headers, row.queue))
        else:
            _elsewhere(fc, out, now, timeout)
    out["text"] = sentence(out)
    return out


def _tickets(task_id: str, headers: dict[str, Any], queue: str) -> list[str]:
    """The ticket ids a parked task may wait under (protocol.py): its own, a retry's, an
    acquire_slot's for *queue*."""
    own = ticket_id({**headers, "id": task_id})
    return list(dict.fromkeys([own, task_id, acquire_ticket(task_id, queue)]))


def _state(app: Any, task_id: str) -> str | None:
    """The result backend's state of *task_id*; ``None`` where results are not kept."""
    try:
        return str(app.AsyncResult(task_id).state)
    except Exception:  # no result backend (DisabledBackend raises), or it can't be reached
        return None


def _elsewhere(fc: Any, out: dict[str, Any], now: float, timeout: float) -> None:
    """No row: admitted somewhere (a busy slot names it), or lingering on a worker."""
    task_id = out["task_id"]
    for queue in _queues(fc):
        try:
            slots = fc.backend.busy_slots(queue)
        except FlowControlError:
            continue
        for s in slots:
            if task_id_of(s.task_id) == task_id:
                out.update(where="running", queue=queue, key=s.fairness_key or None,
                           worker=s.holder, slot=s.slot_id, since=s.acquired_at)
                return
    found = _ask_workers(fc.app, task_id, timeout)
    if found is not None:
        worker, where = found
        out.update(where=where.get("where", "lingering"), queue=where.get("queue"),
                   worker=worker)
        if out["where"] == "lingering" and out["queue"]:
            _in_line(fc, out, now, [task_id])
    elif out["state"] == "STARTED":
        out["where"] = "running"  # outside any flow queue, or its slot already given back


def _batch_due(fc: Any, key: str) -> float | None:
    """When the batch gathering the calls of batch key *key* is due (its own row's instant),
    or ``None`` while none gathers them (one is starting, or running)."""
    holder = claims_of(fc.app).holder("batch", key)
    batch = fc.store.get(holder) if holder else None
    return None if batch is None else batch.wake_at


def _queues(fc: Any) -> list[str]:
    try:
        return list(fc.backend.queues())
    except FlowControlError:
        return []


def _ask_workers(app: Any, task_id: str, timeout: float) -> tuple[str, dict[str, Any]] | None:
    """(worker, its answer) of the first worker that has *task_id*, within *timeout* s."""
    try:
        replies = app.control.broadcast("flowcontrol_where", arguments={"task_id": task_id},
                                        reply=True, timeout=timeout)
    except Exception:  # no broker to ask: the workers can't tell, it stays unseen
        return None
    for reply in replies or []:
        for worker, answer in reply.items():
            if isinstance(answer, dict) and answer.get("where"):
                return worker, answer
    return None


def _in_line(fc: Any, out: dict[str, Any], now: float, tickets: list[str]) -> None:
    """The queue's figures, its grants and its place in line (the backend's ``place``: one
    read, not one per waiter), for the task whose ticket is one of *tickets*."""
    queue, task_id = out["queue"], out["task_id"]
    try:
        stats: QueueStats = fc.backend.stats(queue)
        grants = fc.backend.pending_grants(queue)
    except FlowControlError:
        # No flow queue (a debounced call's, a batch's, a flow_group's gone with its group):
        # only its row's own instant holds it.
        if out["reason"] is not None and out["retry_at"] is not None:
            out["blocked_by"] = [{"reason": out["reason"], "until": out["retry_at"]}]
        out["estimated_start"] = _estimate(out, now, None)
        return
    out["waiting"] = stats.waiting
    grant = next((g for g in grants if task_id_of(g.task_id) == task_id), None)
    if grant is not None:
        out.update(where="granted", reason=Reason.GRANT.value, position=None,
                   estimated_start=now, slot=grant.slot_id, grant_expires_at=grant.expires_at)
        out["blocked_by"] = blocked_by(out, stats, fc.config_of(queue), [], now)
        return
    place = None
    for ticket in tickets:  # its ticket: the task id, a retry's, or an acquire_slot's
        place = fc.backend.place(queue, ticket)
        if place is not None:
            break
    if place is not None:
        out["position"] = place.position
        out["ahead"] = {"total": place.position - 1, "higher_priority": place.higher_priority,
                        "other_keys": place.other_keys}
    config = fc.config_of(queue)
    if out["reason"] is None:
        out["reason"] = Reason.CONCURRENCY.value
    holders = []
    if out["reason"] in (Reason.CONCURRENCY.value, Reason.KEY_CONCURRENCY.value):
        holders = fc.backend.busy_slots(queue)
    out["blocked_by"] = blocked_by(out, stats, config, holders, now)
    rate = None
    if out["reason"] == Reason.CONCURRENCY.value and out["position"] is not None:
        try:
            rate = fc.backend.release_rate(queue)
        except FlowControlError:
            pass  # no estimate, the rest stands
    out["release_rate"] = rate
    out["estimated_start"] = _estimate(out, now, rate)


def _estimate(out: dict[str, Any], now: float, release_rate: float | None) -> float | None:
    """When it should start: the instant its window, backoff, timed pause, ETA or burst lets
    it in (none while paused until resumed); for a slot of the queue, its place in line over
    the queue's recent release rate (one slot freed per waiter ahead and one for itself), if
    it gave back at least one slot per RELEASE_TAU lately; a key's own cap has no such figure
    (its key's releases are not counted apart)."""
    timed = {Reason.RATE.value, Reason.KEY_RATE.value, Reason.BACKOFF.value, Reason.ETA.value,
             Reason.DEBOUNCE.value, Reason.BATCH.value, Reason.PAUSED.value}
    until = [b["until"] for b in out["blocked_by"] if b.get("until") is not None]
    if any(b["reason"] == Reason.PAUSED.value and b["until"] is None for b in out["blocked_by"]):
        return None  # paused until resumed: nobody knows when
    if out["reason"] in timed:
        if not until and out["retry_at"] is None:
            return None  # its instant is not known (a batch not gathering yet)
        at = max([*until, out["retry_at"] or now])
        return max(at, now)
    if release_rate is not None and release_rate * RELEASE_TAU >= 1.0:
        return now + out["position"] / release_rate
    return None
