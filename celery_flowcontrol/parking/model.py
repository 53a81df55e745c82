"""The parking tables (SQLAlchemy 2 typed models) and the plain-data views of their rows.

``flowcontrol_parked`` holds one row per parked message: everything needed to republish it
identically with kombu (body bytes, content type and encoding, headers, properties, exchange,
routing key) plus what the wake path orders and filters by (queue, priority, fairness key,
arrival sequence, ``wake_at``, the claim lease).

Keys: ``seq`` is the surrogate primary key, assigned by the database in arrival order (SQLite
``AUTOINCREMENT``, so a value is never reused even after the newest row is deleted; a
PostgreSQL ``BIGSERIAL``), and doubles as the arrival sequence. ``task_id`` is UNIQUE: that is
what makes a redelivered message park once. The surrogate key keeps the sequence inside the
row's own insert (no counter table to update) and the claim's ``seq IN (...)`` on an integer.

``flowcontrol_woken`` remembers, for a while, the last wake of each task id's row (the row's
``seq``, its claims so far, ``attempts``, which tell one wake of a row from the next, and the
ticket): a message the broker delivers again after its node died between a park's
commit and its ack may meet a row woken and deleted already, and this tells it that the woken
copy is the one to run (worker/park.py). Old entries are forgotten (``Wakes.forget``, parking/wakes.py).

``flowcontrol_dead`` keeps messages that could not be parked for a reason other than an outage
(an oversized or malformed value). Its text columns have no length limit, so a message rejected
for a too-long field can still be stored there.

Headers and properties are JSON text. Values JSON lacks (bytes, datetimes, decimals: AMQP
headers may carry them) are stored as tagged objects and come back as the same Python type.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import BigInteger, Double, Index, Integer, LargeBinary, MetaData, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "Base",
    "DeadLetter",
    "DeadRow",
    "ParkedMessage",
    "ParkedRow",
    "Requeue",
    "WokenRow",
    "decode_json",
    "encode_json",
]

#: Column limits of ``flowcontrol_parked``; the store checks them itself, because SQLite
#: ignores VARCHAR lengths and every database should reject the same messages.
LIMITS = {
    "task_id": 255,
    "queue": 64,
    "task_name": 255,
    "fairness_key": 256,
    "content_type": 128,
    "content_encoding": 64,
    "exchange": 255,
    "routing_key": 255,
    "reason": 32,
}

# SQLite only auto-numbers a column declared exactly INTEGER PRIMARY KEY.
_SEQ = BigInteger().with_variant(Integer(), "sqlite")


def not_on(ddl: Any, target: Any, bind: Any, tables: Any = None, state: Any = None, *, dialect: Any, **kw: Any) -> bool:
    """``ddl_if(callable_=not_on, state="postgresql")``: created on every dialect but ``state``."""
    return bool(dialect.name != state)


class Base(DeclarativeBase):
    """Declarative base of the parking tables, with its own metadata (and constraint names)."""

    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class ParkedRow(Base):
    """One parked message in ``flowcontrol_parked``."""

    __tablename__ = "flowcontrol_parked"
    __table_args__ = (
        # The claim's index: due rows by wake_at, carrying what the claim filters and sorts by,
        # so a backlog of due rows is sorted from the index alone (no row reads), while a poll
        # that finds nothing due reads one entry.
        # PostgreSQL has ix_flowcontrol_parked_due instead (below).
        Index("ix_flowcontrol_parked_wake_at", "wake_at", "priority", "seq", "claimed_until").ddl_if(
            callable_=not_on, state="postgresql"
        ),
        Index("ix_flowcontrol_parked_queue_wake_at", "queue", "wake_at"),
        {"sqlite_autoincrement": True},
    )

    seq: Mapped[int] = mapped_column(_SEQ, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(LIMITS["task_id"]), unique=True)
    queue: Mapped[str] = mapped_column(String(LIMITS["queue"]))
    task_name: Mapped[str] = mapped_column(String(LIMITS["task_name"]), default="")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    fairness_key: Mapped[str | None] = mapped_column(String(LIMITS["fairness_key"]))
    # Epoch seconds as doubles: the same unit as the admission clock's retry_at.
    wake_at: Mapped[float] = mapped_column(Double)
    parked_at: Mapped[float] = mapped_column(Double)
    claimed_until: Mapped[float | None] = mapped_column(Double)
    body: Mapped[bytes] = mapped_column(LargeBinary)
    content_type: Mapped[str] = mapped_column(String(LIMITS["content_type"]))
    content_encoding: Mapped[str] = mapped_column(String(LIMITS["content_encoding"]))
    headers: Mapped[str] = mapped_column(Text)
    properties: Mapped[str] = mapped_column(Text)
    exchange: Mapped[str] = mapped_column(String(LIMITS["exchange"]), default="")
    routing_key: Mapped[str] = mapped_column(String(LIMITS["routing_key"]), default="")
    reason: Mapped[str] = mapped_column(String(LIMITS["reason"]))
    attempts: Mapped[int] = mapped_column(Integer, default=0)


# PostgreSQL only: the claim's ORDER BY ... LIMIT ... FOR UPDATE SKIP LOCKED cannot stop early
# from the wake_at index (rows are locked before the limit, so every due row is sorted: 0.3 s
# at 100k due rows); read in this order, it stops after ``limit`` rows. Its planner picks this or
# the wake_at index by the claim's actual ``now``. SQLite's planner would take this one even
# when nothing is due (a scan of every row on each poll), so SQLite does without.
Index("ix_flowcontrol_parked_rank", ParkedRow.priority.desc(), ParkedRow.seq).ddl_if(dialect="postgresql")
# PostgreSQL: the due rows by wake_at, and no index holds claimed_until. Covering buys nothing
# there (FOR UPDATE reads every row it locks), while an indexed claimed_until made each lease a
# non-HOT update: new entries in all five indexes. Now a claim's UPDATE is HOT (less work per claim,
# and no index bloat from leases; docs/parking.md).
Index("ix_flowcontrol_parked_due", ParkedRow.wake_at).ddl_if(dialect="postgresql")


class WokenRow(Base):
    """The last woken row of one task id, in ``flowcontrol_woken`` (module docstring)."""

    __tablename__ = "flowcontrol_woken"
    __table_args__ = (Index("ix_flowcontrol_woken_woken_at", "woken_at"),)

    task_id: Mapped[str] = mapped_column(String(LIMITS["task_id"]), primary_key=True)
    ticket: Mapped[str] = mapped_column(Text)
    seq: Mapped[int] = mapped_column(BigInteger)
    attempts: Mapped[int] = mapped_column(Integer)
    woken_at: Mapped[float] = mapped_column(Double)


class DeadRow(Base):
    """A message that could not be parked, in ``flowcontrol_dead`` (unbounded text columns)."""

    __tablename__ = "flowcontrol_dead"
    __table_args__ = (Index("ix_flowcontrol_dead_created_at", "created_at"),)

    id: Mapped[int] = mapped_column(_SEQ, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(Text)
    queue: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)
    error: Mapped[str] = mapped_column(Text)
    task_name: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(BigInteger)
    fairness_key: Mapped[str | None] = mapped_column(Text)
    body: Mapped[bytes] = mapped_column(LargeBinary)
    content_type: Mapped[str] = mapped_column(Text)
    content_encoding: Mapped[str] = mapped_column(Text)
    headers: Mapped[str] = mapped_column(Text)
    properties: Mapped[str] = mapped_column(Text)
    exchange: Mapped[str] = mapped_column(Text)
    routing_key: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Double)


@dataclass(frozen=True)
class ParkedMessage:
    """A parked message as plain data: what :meth:`ParkingStore.park` takes and the reads return.

    ``reason`` says why it was parked (``concurrency``, ``rate``, ``eta``, ``grant``, ...).
    ``seq``, ``parked_at`` and ``claimed_until`` are filled in by the store; ``attempts`` counts
    the claims (wake attempts) of this row so far.
    """

    task_id: str
    queue: str
    body: bytes
    wake_at: float
    task_name: str = ""
    priority: int = 0
    fairness_key: str | None = None
    content_type: str = "application/json"
    content_encoding: str = "utf-8"
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    exchange: str = ""
    routing_key: str = ""
    reason: str = "concurrency"
    attempts: int = 0
    seq: int | None = None
    parked_at: float | None = None
    claimed_until: float | None = None


@dataclass(frozen=True)
class DeadLetter:
    """A message kept in ``flowcontrol_dead``: why it could not be parked, and the message itself.

    ``message.wake_at`` and ``message.parked_at`` are the time it was dead-lettered, and
    ``message.reason`` is ``reason``.
    """

    id: int
    task_id: str
    queue: str
    reason: str
    error: str
    created_at: float
    message: ParkedMessage


@dataclass(frozen=True)
class Requeue:
    """What :meth:`~.dead_letters.DeadLetterTable.requeue` did with one dead letter: parked anew, due at
    once (``refused`` is ``None``), or left in the table with the reason it can't be parked
    (``refused``: its task id is parked already, or a field the table can't hold)."""

    letter: DeadLetter
    refused: str | None = None

    @property
    def requeued(self) -> bool:
        """True when the dead letter was parked anew (and left the dead-letter table)."""
        return self.refused is None


# -- JSON with the few types AMQP headers carry that JSON lacks -----------------------------

_TAG = "__flowcontrol__"


def _default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_TAG: "bytes", "v": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, dt.datetime):
        return {_TAG: "datetime", "v": value.isoformat()}
    if isinstance(value, dt.date):
        return {_TAG: "date", "v": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {_TAG: "decimal", "v": str(value)}
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"a value of type {type(value).__name__} can't be stored: {value!r:.80}")


_DECODERS = {
    "bytes": lambda v: base64.b64decode(v),
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "decimal": decimal.Decimal,
}


def _hook(obj: dict[str, Any]) -> Any:
    tag = obj.get(_TAG)
    if tag is not None and len(obj) == 2 and tag in _DECODERS:
        return _DECODERS[tag](obj["v"])
    return obj


def encode_json(value: dict[str, Any]) -> str:
    """Serialise headers or properties; ``TypeError``/``ValueError`` for what can't be stored.

    ASCII-only output (``\\uXXXX`` escapes): any database encoding can hold it, and a lone
    surrogate in a header survives the trip instead of failing in the driver.
    """
    return json.dumps(value, default=_default, ensure_ascii=True, separators=(",", ":"))


def decode_json(text: str) -> dict[str, Any]:
    """The inverse of :func:`encode_json`."""
    # The hook runs in Python for every object; most headers have no tagged value at all.
    value = json.loads(text, object_hook=_hook) if _TAG in text else json.loads(text)
    return value if isinstance(value, dict) else {}
