"""What holds a waiting task, as data (``blocked_by``) and as one sentence (``text``)."""

from __future__ import annotations

from typing import Any

from ..admission.values import QueueStats, Slot
from ..reasons import Reason
from .text import duration

__all__ = ["blocked_by", "ordinal", "sentence"]


def blocked_by(out: dict[str, Any], stats: QueueStats, config: Any, holders: list[Slot],
               now: float) -> list[dict[str, Any]]:
    """Everything that holds the task of *out* now, each with until when where it is known:
    a slot reserved for it, busy slots and by whom, a full rate window, its key's cap, a
    backoff or a pause (of the queue, else of its key), its ETA, a gathering burst."""
    reason, until = out["reason"], out["retry_at"]
    held: list[dict[str, Any]] = []
    if reason == Reason.GRANT.value:
        held.append({"reason": reason, "slot": out.get("slot"),
                     "until": out.get("grant_expires_at")})
        return held
    if stats.backoff_until is not None and stats.backoff_until > now:
        held.append({"reason": Reason.BACKOFF.value, "until": stats.backoff_until})
    for r in stats.rates:
        limit = r.rate.limit if r.live is None else r.live
        if r.used >= limit:
            held.append({"reason": Reason.RATE.value, "limit": r.rate.describe(),
                         "used": r.used, "until": until})
    if reason == Reason.KEY_RATE.value:
        held.append({"reason": reason, "key": out["key"], "until": until})
    if reason == Reason.CONCURRENCY.value and stats.capacity is not None:
        held.append({"reason": reason, "busy": stats.in_use, "granted": stats.granted,
                     "capacity": stats.capacity,
                     "holders": sorted({s.holder for s in holders})})
    if reason == Reason.KEY_CONCURRENCY.value:
        mine = [s for s in holders if s.fairness_key == out["key"]]
        held.append({"reason": reason, "key": out["key"], "busy": len(mine),
                     "cap": getattr(config, "per_key_concurrency", None),
                     "holders": sorted({s.holder for s in mine})})
    if reason == Reason.PAUSED.value:
        # The queue's pause, else its key's (math.inf: until resumed; then no end is known).
        queue_until = stats.paused_until
        end = queue_until if queue_until is not None else until
        held.append({"reason": reason, "key": None if queue_until is not None else out["key"],
                     "until": None if end is None or end == float("inf") else end})
    if reason in (Reason.ETA.value, Reason.DEBOUNCE.value, Reason.BATCH.value):
        held.append({"reason": reason, "until": until})
    if reason == Reason.BACKOFF.value and not any(h["reason"] == reason for h in held):
        held.append({"reason": reason, "until": until})  # its key's backoff, not the queue's
    return held


def ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``, ``21st``..."""
    tail = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{tail}"


def _why(out: dict[str, Any], now: float) -> str:
    reason = out["reason"]
    for b in out["blocked_by"]:
        if b["reason"] != reason:
            continue
        if reason == Reason.CONCURRENCY.value:
            return f"{b['busy'] + b['granted']} of {b['capacity']} slots busy"
        if reason == Reason.KEY_CONCURRENCY.value:
            return f"key {b['key']} holds {b['busy']} of its {b['cap']} slots"
        if reason == Reason.RATE.value:
            return f"rate limit {b['limit']} used up"
        if reason == Reason.PAUSED.value:
            whom = "the queue" if b["key"] is None else f"key {b['key']}"
            return f"{whom} is paused" + (" until resumed" if b["until"] is None else "")
    words = {Reason.RATE.value: "its queue's rate limit is used up",
             Reason.KEY_RATE.value: f"key {out['key']}'s rate limit is used up",
             Reason.BACKOFF.value: "a backoff pauses the queue",
             Reason.PAUSED.value: "the queue is paused",
             Reason.ETA.value: "its ETA has not come",
             Reason.DEBOUNCE.value: "its debounced burst is gathering",
             Reason.BATCH.value: "its batch is gathering",
             Reason.CONCURRENCY.value: "every slot is busy",
             Reason.KEY_CONCURRENCY.value: f"key {out['key']} holds all its slots"}
    return words.get(reason, str(reason))


def sentence(out: dict[str, Any]) -> str:
    """One sentence a person reads: ``"parked in queue reports, 3rd of 120: 20 of 20 slots
    busy; about 4 s"``."""
    where, queue, now = out["where"], out["queue"], out["now"]
    task = out["task_id"]
    if where == "unseen":
        return (f"task {task} is unseen: no worker has it (still in the broker, "
                "or never sent)")
    if where == "finished":
        return f"task {task} finished: {out['state']}"
    if where == "running":
        on = f" on {out['worker']}" if out["worker"] else ""
        inq = f" in queue {queue}" if queue else ""
        return f"task {task} is running{on}{inq}"
    if where == "granted":
        return (f"task {task} is granted in queue {queue}: a slot is reserved for it, "
                "its message is on its way")
    place = where if where == "parked" else f"lingering on {out['worker']}"
    head = f"{place} in queue {queue}"
    if out["position"] is not None:
        head += f", {ordinal(out['position'])} of {out['waiting']}"
    text = f"task {task} is {head}: {_why(out, now)}"
    start = out["estimated_start"]
    if start is not None:
        text += f"; about {duration(max(0.0, start - now))}"
    return text
