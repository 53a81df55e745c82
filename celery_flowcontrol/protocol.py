"""The wire protocol: flow options as they travel in message headers, the ticket ids made from
them, and the queue names that describe themselves. Producer and worker both import it.

A producer puts ``flow_queue``, ``flow_priority``, ``flow_fairness_key`` and ``flow_cost``
into the message headers; the worker decides from headers alone, without decoding the body.
The fairness key's header was once ``flow_key``: a message that carries only that one (from
an older producer, or one in another language) is still read, with one warning per task name.
Bad values never lose a message; they get a documented behaviour instead:

============================  =================================================================
header value                  behaviour
============================  =================================================================
``flow_queue`` missing        the task's decorator default; none: the task runs ungated
``flow_queue`` not a str      ignored (runs ungated), one warning per task name
``flow_priority`` bad         not an int (or out of +-1,000,000): treated as 0, one warning
                              per task
``flow_fairness_key`` not     converted with ``str()``
a str
``flow_fairness_key`` long    over 256 UTF-8 bytes (or not valid Unicode): replaced by
                              ``"sha256:" + hexdigest`` of it
``flow_fairness_key``         ``flow_key`` if present (deprecated), else the task's decorator
missing                       default (unless a callable: that is evaluated at publish), else
                              the message's ``root_id``
``flow_cost`` missing         the task's decorator default if it is a number (a callable is
                              evaluated at publish), else 1
``flow_cost`` bad             not a finite number > 0: read as NaN, which admission refuses
                              (``CostRefusedError``): the message is dead-lettered, never run
============================  =================================================================
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from .config import MAX_CONCURRENCY, MAX_KEY_BYTES, PRIORITY_MAX, PRIORITY_MIN, QueueConfig
from .errors import FlowControlConfigError

logger = logging.getLogger(__name__)

QUEUE_HEADER = "flow_queue"
PRIORITY_HEADER = "flow_priority"
#: The fairness key (``fairness_key``).
KEY_HEADER = "flow_fairness_key"
#: The fairness key's former header: still read when :data:`KEY_HEADER` is absent.
LEGACY_KEY_HEADER = "flow_key"
#: Shown next to the slot by the CLI and the dashboard (at most 256 bytes are kept).
LABEL_HEADER = "flow_label"
#: ``{queue: {"deadline": epoch, "label": str}}``: slots ``acquire_slot`` waits for.
ACQUIRE_HEADER = "flow_acquire"
#: What one admission charges each ``per="cost"`` rate limit (a number > 0; absent: 1).
COST_HEADER = "flow_cost"
FLOW_HEADERS = (QUEUE_HEADER, PRIORITY_HEADER, KEY_HEADER)
#: Calls that collapse (collapse/): ``flow_unique`` as sent by name (``True`` or a key),
#: ``flow_unique_ttl`` as sent by name, the unique key a call holds, the call a duplicate sent
#: by name collapsed into;
#: ``flow_debounce``, ``flow_debounce_max`` and ``flow_debounce_key`` as sent by name (the
#: options ``flow_debounce``, ``flow_debounce_max``, ``debounce_key``), and the burst a
#: debounced run ends: ``{"first": epoch, "calls": n, "key": str}``.
UNIQUE_HEADER = "flow_unique"
UNIQUE_KEY_HEADER = "flow_unique_key"
UNIQUE_TTL_HEADER = "flow_unique_ttl"
#: ``flow_unique_keep`` as sent by name, and on a call that holds a latest-wins key: ``"latest"``.
UNIQUE_KEEP_HEADER = "flow_unique_keep"
DUPLICATE_HEADER = "flow_duplicate_of"
DEBOUNCE_HEADER = "flow_debounce"
DEBOUNCE_MAX_HEADER = "flow_debounce_max"
DEBOUNCE_KEY_HEADER = "flow_debounce_key"
BURST_HEADER = "flow_debounce_burst"
#: What the worker hands a task through its request (never sent on to a retry).
REQUEST_KEYS = ("flow_slot", "flow_admitted_at", "flow_acquired", "flow_acquire_expired",
                "flow_acquire_unknown", "flow_instance")
#: flow_group's ephemeral queues carry their cap in their name: ``fg.<id>.<concurrency>``,
#: so any worker can re-create one that was removed while members were still in the broker.
EPHEMERAL_RE = re.compile(r"fg\.[0-9a-f]{8,32}\.([1-9][0-9]{0,5})")

_warned: set[tuple[str, str]] = set()


def warn_once(kind: str, name: str, message: str, *args: Any) -> None:
    """Log *message* once per (*kind*, *name*) for the life of the process."""
    if (kind, name) not in _warned:
        _warned.add((kind, name))
        logger.warning(message, *args)


@dataclass(frozen=True, slots=True)
class FlowOptions:
    """What the worker needs to ask for admission: read from one message's headers."""

    queue: str
    priority: int
    key: str
    eta: float | None  # epoch seconds, when the message carries a (possibly past) ETA
    label: str = ""
    expires: float | None = None  # epoch seconds: Celery's ``expires`` header
    cost: float = 1  # NaN for a header no admission can take (read_cost)


def fit_key(key: object) -> str:
    """A fairness key as the admission backend accepts it (see the module table)."""
    if type(key) is str and key.isascii() and len(key) <= MAX_KEY_BYTES:
        return key  # the common case: ASCII text, whose length is its size
    text = key if isinstance(key, str) else str(key)
    try:
        data, valid = text.encode("utf-8"), True
    except UnicodeEncodeError:  # a lone surrogate: not text any backend can store
        data, valid = text.encode("utf-8", "surrogatepass"), False
    if not valid or len(data) > MAX_KEY_BYTES:
        return "sha256:" + hashlib.sha256(data).hexdigest()
    return text


def fit_priority(value: object, task_name: str) -> int:
    """A priority as the admission backend accepts it (see the module table)."""
    if type(value) is int and PRIORITY_MIN <= value <= PRIORITY_MAX:
        return value  # the common case, at one test (a bool is not an int here)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not (
            PRIORITY_MIN <= value <= PRIORITY_MAX):
        warn_once("priority", task_name,
                  "flow_priority %r of task %s is not an int between %d and %d; using 0",
                  value, task_name, PRIORITY_MIN, PRIORITY_MAX)
        return 0
    return value


def parse_eta(value: object) -> float | None:
    """An ETA or ``expires`` header (ISO 8601, as Celery writes it) in epoch seconds; ``None``
    if absent (or unreadable: Celery itself then rejects the message)."""
    if not value:
        return None
    if isinstance(value, datetime):
        when = value
    else:
        try:
            when = datetime.fromisoformat(str(value))
        except ValueError:
            return None  # Celery itself rejects the message; not ours to judge
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def read_options(headers: dict[str, Any], task: Any) -> FlowOptions | None:
    """The flow options of a message for *task*; ``None`` when it is not gated."""
    name = getattr(task, "name", "?")
    queue = headers.get(QUEUE_HEADER) or getattr(task, "flow_queue", None)
    if not queue:
        return None
    if not isinstance(queue, str):
        warn_once("queue-type", name, "flow_queue %r of task %s is not a str; running ungated",
                  queue, name)
        return None
    priority = headers.get(PRIORITY_HEADER)
    if priority is None:
        priority = getattr(task, "flow_priority", 0)
    key = fairness_key_header(headers, name)
    if key is None:
        default = getattr(task, "fairness_key", None)
        key = (None if callable(default) else default) or headers.get("root_id") or headers.get("id")
    cost = headers.get(COST_HEADER)
    if cost is None:
        default = getattr(task, "flow_cost", None)
        cost = 1 if default is None or callable(default) else default
    label = headers.get(LABEL_HEADER)
    if label is None:
        default = getattr(task, "flow_label", None)
        label = None if callable(default) else default
    return FlowOptions(queue, fit_priority(priority, name), fit_key(key or ""),
                       parse_eta(headers.get("eta")), fit_label(label),
                       parse_eta(headers.get("expires")), read_cost(cost))


def fairness_key_header(headers: dict[str, Any], task_name: str = "?") -> Any:
    """The fairness key a message carries: :data:`KEY_HEADER`, else the deprecated
    :data:`LEGACY_KEY_HEADER` (one warning per task name); ``None`` when neither is there."""
    key = headers.get(KEY_HEADER)
    if key is None:
        key = headers.get(LEGACY_KEY_HEADER)
        if key is not None:
            warn_once("legacy-key-header", task_name,
                      "task %s was sent with the deprecated header %r: read as its fairness "
                      "key; producers should send %r", task_name, LEGACY_KEY_HEADER, KEY_HEADER)
    return key


def read_burst(headers: dict[str, Any]) -> dict[str, Any] | None:
    """The burst a debounced run ends (:data:`BURST_HEADER`), or ``None``. A row whose
    producer kept the burst under :data:`DEBOUNCE_HEADER` is read too: there it is the one
    dict-valued form, never a duration a caller sent."""
    burst = headers.get(BURST_HEADER)
    if burst is None:
        burst = headers.get(DEBOUNCE_HEADER)
    return burst if isinstance(burst, dict) else None


def has_fairness_key(headers: dict[str, Any]) -> bool:
    """True if a message's headers carry a fairness key, under either name."""
    return KEY_HEADER in headers or LEGACY_KEY_HEADER in headers


def read_cost(value: object) -> float:
    """A cost as admission takes it: the number when it is a finite number > 0 (``1`` stays
    the int 1), else NaN, which every backend refuses with ``CostRefusedError``."""
    if type(value) is int and value == 1:
        return 1
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf:
        return float(value)
    return math.nan


def fit_label(value: object) -> str:
    """A label as the backend keeps it: text, cut to 256 UTF-8 bytes."""
    if value is None:
        return ""
    data = str(value).encode("utf-8", "surrogatepass")[:256]
    return data.decode("utf-8", "ignore")


def ticket_id(headers: dict[str, Any]) -> str:
    """The waiter identity of a message: its task id, plus the retry count after a retry.

    A retry is a new message with the same task id that may be consumed before the worker
    that ran the previous attempt has released its slot; a distinct ticket keeps the two
    attempts from sharing (and then double-freeing) one slot.
    """
    task_id = str(headers.get("id") or "")
    retries = headers.get("retries") or 0
    return f"{task_id}~r{retries}" if isinstance(retries, int) and retries > 0 else task_id


def acquire_ticket(task_id: str, queue: str) -> str:
    """The waiter identity of ``acquire_slot(queue)`` in task *task_id* (queue names have no
    ``@``, so the task id is recovered from the right)."""
    return f"{task_id}@{queue}"


def task_id_of(ticket: str) -> str:
    """The task id a ticket id was made from (:func:`ticket_id`, :func:`acquire_ticket`)."""
    base, sep, _ = ticket.rpartition("@")
    if sep:
        return base
    base, sep, n = ticket.rpartition("~r")
    return base if sep and n.isdigit() else ticket


def read_acquire(headers: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """The slots a re-run task waits for: ``{queue: (deadline, label)}``; bad entries are
    dropped (the task then asks again, or times out, inside ``acquire_slot``)."""
    raw = headers.get(ACQUIRE_HEADER)
    out: dict[str, tuple[float, str]] = {}
    if isinstance(raw, dict):
        for queue, spec in raw.items():
            if isinstance(queue, str) and isinstance(spec, dict):
                deadline = spec.get("deadline")
                if isinstance(deadline, (int, float)) and not isinstance(deadline, bool):
                    out[queue] = (float(deadline), str(spec.get("label") or "")[:256])
    return out


def ephemeral_config(name: str) -> QueueConfig | None:
    """The config a queue name describes by itself (a flow_group's ``fg.<id>.<n>``, a serial
    task's ``serial.<task>``), or ``None`` for any other name."""
    if name.startswith("serial."):
        try:
            return QueueConfig(name, concurrency=1)
        except FlowControlConfigError:
            return None  # not a name serial_config() makes: an unknown queue like any other
    match = EPHEMERAL_RE.fullmatch(name)
    if match is None or int(match.group(1)) > MAX_CONCURRENCY:
        return None
    return QueueConfig(name, concurrency=int(match.group(1)))
