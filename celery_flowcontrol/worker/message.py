"""A broker message and its parked row: what parking keeps, and how a woken row is published.

Parking must be invisible to Celery: the message that comes back is the one that arrived, with
every header and property kombu and Celery define, in their own units. Two of them change on
the way, on purpose, and both are undone before the task can see them:

* ``priority``: a woken message comes back ahead of the fresh arrivals of its own priority
  (its turn has come; it must not queue again behind messages that will only be parked), and
  behind nothing plain Celery would not serve first. On the Redis transport it keeps its
  priority and is pushed at the head of its priority step's list (:func:`publish_first`); on
  RabbitMQ it goes one priority above its own (:func:`woken_priority`; a queue declared with
  ``x-max-priority`` honours it). Its own priority travels in the :data:`WOKEN_HEADER` header,
  and :class:`~celery_flowcontrol.worker.request.FlowRequest` puts it back into the request's
  ``delivery_info`` and ``properties`` (where ``Task.retry`` reads it) and drops the header, so
  a retry or the task itself sees what was sent. A row parked again from a woken message
  stores the original priority, not the one it was woken with. The header also names the row
  the message was published from and by which claim of it (:func:`woken_from`): a copy the broker delivers again after
  its node died tells by it whether it is the woken copy of a row or the message that row
  was parked from (worker/park.py).
* ``expiration`` (the broker's TTL, kombu keeps it as milliseconds in a string, while
  ``Producer.publish`` takes seconds): a woken message carries only the time it has left
  (none when less than :data:`MIN_TTL` is left of a Celery task's, which the worker revokes
  itself if it comes too late).
  One whose time ran out while parked is published without a TTL (the broker would drop it
  unseen) and with Celery's ``expires`` header in the past, so the worker marks it REVOKED as
  an expired task, as plain Celery does; a row wakes at its expiry at the latest for that.

Properties that belong to one delivery (delivery tag and info, the Redis transport's
``body_encoding``) and the AMQP copies of what has its own column (content type and encoding,
``application_headers``) are not stored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from kombu.compression import compress

from ..kombu_redis import publish_first, pushes_first
from ..parking import ParkedMessage
from ..protocol import parse_eta
from ..reasons import reason_of

__all__ = ["SET_ON_WAKE", "WOKEN_HEADER", "body_bytes", "expires_at", "parked_of",
           "publish_parked", "restore_priority", "served_last_first", "woken_from", "woken_priority"]

#: On every woken message: ``{"row": <the seq of the row it was published from>, "wake": <its
#: claims so far, this one's included>}`` (one wake of the row), plus
#: ``"priority"`` (the message's own, or None) and ``"as"`` (the broker priority it was woken
#: with) when the wake moved it to the front.
WOKEN_HEADER = "flow_woken"
#: Stored properties a republish sets itself; every other one goes back to
#: ``Producer.publish`` as it was stored, as Celery passes its own (Celery 5.3 sends
#: ``replaced_task_nesting`` as a property; AMQP keeps the ones it defines).
SET_ON_WAKE = frozenset(("priority", "expiration"))
#: Not stored: set again by the broker for each delivery, or kept in a column of their own.
NOT_STORED = frozenset(("delivery_info", "delivery_tag", "body_encoding", "content_type",
                        "content_encoding", "application_headers"))
#: Seconds left below which a woken message with Celery's ``expires`` header goes without a
#: broker TTL: a row wakes at its expiry, and RabbitMQ would drop a message with milliseconds
#: left before any worker saw it; the worker revokes it (expired) when it comes, late.
MIN_TTL = 1.0
#: AMQP's highest message priority (RabbitMQ caps it at the queue's ``x-max-priority``).
AMQP_TOP = 255


def body_bytes(message: Any) -> bytes:
    """The message body as sent: py-amqp hands a text body over decoded, as ``str``, and kombu
    hands a compressed one over decompressed (its ``compression`` header still names how)."""
    body = message.body
    if isinstance(body, str):
        body = body.encode(message.content_encoding or "utf-8")
    compression = (message.headers or {}).get("compression")
    if compression and not getattr(message, "errors", None):
        body, _ = compress(body, compression)
    return bytes(body)


def woken_priority(transport: str, own: Any) -> Any:
    """The broker priority a woken message of priority *own* is published with on *transport*
    (kombu's ``driver_type``): one above its own on RabbitMQ (higher first), ahead of every
    fresh message of its priority; its own elsewhere (the Redis transport serves it first
    from the head of its list instead, :func:`publish_first`)."""
    if transport == "amqp":
        level = own if isinstance(own, int) and not isinstance(own, bool) else 0
        return min(max(level, 0) + 1, AMQP_TOP)
    return own


def served_last_first(producer: Any) -> bool:
    """True where woken messages go to the head of their list (the Redis transport), so the
    one published last is served first: a batch is published last in line first."""
    return pushes_first(producer)


def own_priority(headers: Mapping[str, Any], properties: Mapping[str, Any]) -> Any:
    """The priority a message was sent with, before a wake moved it to the front."""
    woken = headers.get(WOKEN_HEADER)
    if isinstance(woken, dict) and "as" in woken and properties.get("priority") == woken["as"]:
        return woken.get("priority")
    return properties.get("priority")


def woken_from(headers: Mapping[str, Any]) -> tuple[int, int] | None:
    """The wake that published a woken message: the ``seq`` of its row and the row's claims
    then (``attempts``); ``None`` for a message no waker published."""
    woken = headers.get(WOKEN_HEADER)
    if not isinstance(woken, dict):
        return None
    row, wake = woken.get("row"), woken.get("wake")
    if isinstance(row, bool) or isinstance(wake, bool) or not isinstance(row, int) or not isinstance(wake, int):
        return None
    return row, wake


def ttl_seconds(ttl: Any) -> float:
    """An ``expiration`` property (milliseconds, as kombu keeps it) in seconds;
    ``ValueError`` for one that is not a finite number."""
    try:
        seconds = float(ttl) / 1000.0
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds):
        raise ValueError(f"expiration {ttl!r:.40} is not a finite number of milliseconds")
    return seconds


def expires_at(headers: Mapping[str, Any], properties: Mapping[str, Any], now: float) -> float | None:
    """When a message arriving at *now* expires (epoch seconds): Celery's ``expires`` header
    or the broker TTL (``expiration``, milliseconds), whichever comes first; ``None`` if it
    has neither. ``ValueError`` for a TTL that is not a number."""
    instants = []
    expires = parse_eta(headers.get("expires"))
    if expires is not None:
        instants.append(expires)
    ttl = properties.get("expiration")
    if ttl is not None:
        instants.append(now + ttl_seconds(ttl))
    return min(instants) if instants else None


def parked_of(message: Any, *, task_id: str, queue: str, task_name: str, priority: int,
              key: str | None, wake_at: float, reason: str, now: float) -> ParkedMessage:
    """The row that keeps *message* (a kombu message) exactly; it wakes at *wake_at*, or at
    its expiry if that comes first. An ``expiration`` that is no number (only the Redis
    transport lets one through; RabbitMQ refuses it at publish) means nothing to any broker
    or to Celery: it is not kept, and the task runs as plain Celery would run it."""
    headers = dict(message.headers or {})
    raw = message.properties or {}
    props = {k: v for k, v in raw.items() if k not in NOT_STORED}
    if WOKEN_HEADER in headers:
        props["priority"] = own_priority(headers, raw)
        del headers[WOKEN_HEADER]
    if props.get("priority") is None:
        props.pop("priority", None)
    try:
        expires = expires_at(headers, props, now)
    except ValueError:
        del props["expiration"]
        expires = expires_at(headers, props, now)
    if props.get("expiration") is not None and expires is not None:
        # Kept as the time left at parking; the wake subtracts the time spent parked.
        props["expiration"] = str(max(0, int((expires - now) * 1000)))
    info = message.delivery_info or {}
    said = reason_of(reason)  # the row says why in reasons.py's words (per_key: key-concurrency)
    return ParkedMessage(
        task_id=task_id, queue=queue, body=body_bytes(message),
        wake_at=wake_at if expires is None else min(wake_at, expires), task_name=task_name,
        priority=priority, fairness_key=key,
        content_type=message.content_type or "application/json",
        content_encoding=message.content_encoding or "utf-8", headers=headers,
        properties=props, exchange=info.get("exchange") or "",
        routing_key=info.get("routing_key") or "",
        reason=said.value if said is not None else str(reason))


def publish_parked(producer: Any, m: ParkedMessage, now: float) -> None:
    """Publish a parked message as it first arrived, ahead of the fresh ones of its priority
    (see the module docstring), with the time it has left. ``ValueError`` for a row whose TTL is no
    number (the caller dead-letters what can't be published)."""
    # NOT_STORED too: a row parked by an earlier release may still hold them.
    props = {k: v for k, v in m.properties.items()
             if k not in SET_ON_WAKE and k not in NOT_STORED and v is not None}
    headers = dict(m.headers)
    ttl = m.properties.get("expiration")
    if ttl is not None:
        parked_for = max(0.0, now - (m.parked_at if m.parked_at is not None else now))
        left = ttl_seconds(ttl) - parked_for
        celery_expires = parse_eta(headers.get("expires"))
        if left > MIN_TTL or (left > 0 and celery_expires is None):
            props["expiration"] = left  # seconds: Producer.publish turns it into milliseconds
        elif celery_expires is None:
            # Expired in the table: the broker would drop it unseen. Celery's own header
            # makes the worker mark it REVOKED (expired) instead.
            headers["expires"] = datetime.fromtimestamp(now + left, timezone.utc).isoformat()
    transport = getattr(producer.connection.transport, "driver_type", "")
    own = m.properties.get("priority")
    woken = woken_priority(transport, own)
    headers[WOKEN_HEADER] = {"row": m.seq, "wake": m.attempts}  # which wake sent it (woken_from)
    if woken != own:
        headers[WOKEN_HEADER].update({"priority": own, "as": woken})
    if woken is not None:
        props["priority"] = woken
    if served_last_first(producer) and publish_first(
            producer, m.body, exchange=m.exchange, routing_key=m.routing_key, headers=headers,
            content_type=m.content_type, content_encoding=m.content_encoding, properties=props):
        return
    producer.publish(
        m.body, exchange=m.exchange, routing_key=m.routing_key, headers=headers,
        content_type=m.content_type, content_encoding=m.content_encoding,
        retry=True, retry_policy={"max_retries": 3}, **props)


def restore_priority(headers: dict[str, Any], delivery_info: dict[str, Any],
                     properties: dict[str, Any]) -> dict[str, Any]:
    """Undo a wake's move to the front in what a request shows the task: pops
    :data:`WOKEN_HEADER` from *headers* and, when the message still has the priority the wake
    gave it, puts its own back into *delivery_info*; returns the properties to show."""
    woken = headers.pop(WOKEN_HEADER, None)
    if not isinstance(woken, dict) or "as" not in woken or properties.get("priority") != woken["as"]:
        return properties
    delivery_info["priority"] = woken.get("priority")
    shown = {k: v for k, v in properties.items() if k != "priority"}
    if woken.get("priority") is not None:
        shown["priority"] = woken["priority"]
    return shown
