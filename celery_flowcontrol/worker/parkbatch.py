"""Parks in batches: the denials of the consumer's loop committed together, then acked.

Under a flood the backlog drains out of the broker into the parking table (linger.py), and each
park was a durable commit of its own (a disk flush, and on SQLite the database's one write lock,
which every worker node of the file takes in turn) made on the consumer's loop, which stood
still meanwhile. Here the denied messages of one turn of the loop go to a writer thread of
their own as one batch, committed in one transaction (:meth:`ParkingStore.park_many`); while a
batch is being committed, the loop goes on, and the denials of its next turns wait to be the
next batch (a group commit: the slower the commit, the larger the batch). While denials keep
coming, a batch starts at most every :data:`EVERY` seconds: a commit costs the same few hundred
microseconds of the worker's CPU (and a disk flush) for one row as for a dozen, so a flood
fetched a message or two per commit paid that for nearly every message. Each message is acked
once its batch is committed: on kombu's Redis transport by the writer itself, right after the
commit, in one round trip for the whole batch (kombu_redis.py's ``AckTogether``; the loop then only
records the acks, so it never waits for the broker's answer), else on the loop.

What holds, as for a park alone:

* nothing is acked before its row is committed: a batch whose commit fails (the database
  can't be reached) acks none of its messages; each is deferred and tried again, as a single
  park that fails is;
* a message the batch did not store (refused by the database, or a task id whose row is there
  already: a redelivery, or a row a waker is republishing right now) is then parked alone, by
  the parker, exactly as before: dead-lettered, acked as a redelivery, or deferred. It never
  sinks the others;
* the row of a task id parks once, and a batch keeps the order of arrival (``seq``);
* a message waiting for its batch holds a place of the prefetch window until its ack, so the
  consumer's QoS is raised by one for it while it waits (at most :data:`MOST` at once): the
  loop goes on taking messages, as it would had the park been instant;
* the consumer stops (shutdown, a broker reconnect): the messages waiting are forgotten,
  unacked, and so is a batch whose commit ends after the stop, unless the writer acked it (then
  its rows are parked for good, as any other); the broker delivers the others again, they keep
  their tickets in line, and a row committed meanwhile parks the redelivery once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ParkingUnavailableError
from ..kombu_redis import AckTogether, ack_together
from ..parking import ParkedMessage, ParkingRejectedError, ParkingStore
from .crashpoints import crashpoint
from .delivery import Delivery, Outage, Outcome
from .drain import Floods
from .message import parked_of
from .park import Parker

logger = logging.getLogger(__name__)

#: Messages at most that wait for a batch with the window raised for them; past that, the
#: window fills and the consumer waits for a commit.
MOST = 200
#: Seconds at least from one batch's start to the next one's, while denials keep coming (a
#: denial after a quiet spell starts its batch at the end of its turn of the loop).
EVERY = 0.025


@dataclass(slots=True, eq=False)
class _Waiting:
    """A denied delivery waiting for its batch: its row, how to park it alone, and whether the
    window was raised for it."""

    d: Delivery
    parked: ParkedMessage
    park: dict[str, Any]  # Parker.park's keyword arguments, for a park alone
    raised: bool

    def decided(self, outcome: Outcome) -> None:
        """The batch decided it: recorded on its delivery (delivery.py), then handed on."""
        assert self.d.later is not None
        self.d.later(self.d.state.record(outcome))


class ParkBatch:
    """The denied messages of one worker instance's consumer loop, parked together (module
    docstring). Everything runs on the loop's thread, but the commits."""

    def __init__(self, *, store: ParkingStore, parker: Parker, clock: Callable[[], float],
                 outage: Outage, most: int = MOST, every: float = EVERY,
                 floods: Floods | None = None) -> None:
        self.store = store
        self.floods = floods  # told of each queue whose denials are parked (drain.py)
        self.parker = parker
        self.clock = clock
        self.outage = outage
        self.most = most
        self.every = every
        self.batches = 0  # batches committed
        self._started = float("-inf")  # monotonic time the last batch went to the writer
        self._timer: Any = None  # sends the next batch once EVERY has passed
        self._hub: Any = None
        self._qos: Any = None
        self._generation = 0  # one per attach: a batch of a stopped consumer is forgotten
        self._waiting: list[_Waiting] = []
        self._writing = False  # a batch is with the writer
        self._raised = 0  # window places given back to messages waiting
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None

    def attach(self, hub: Any, qos: Any = None) -> None:
        """From now on, batch the parks decided on *hub* (the consumer's event loop), raising
        *qos* (the consumer's prefetch window) while they wait. The bootstep calls it on every
        consumer start."""
        self.detach()
        self._hub, self._qos = hub, qos

    def detach(self) -> None:
        """The consumer stopped: forget what waits, unacked (the broker delivers it again)."""
        self._generation += 1
        if self._timer is not None:
            self._timer.cancel()
        self._hub = self._qos = self._timer = None
        self._waiting, self._writing, self._raised = [], False, 0

    def close(self) -> None:
        """Stop the writer (after the batch it is committing)."""
        self.detach()
        writer, self._writer = self._writer, None
        if writer is not None:
            self._inbox.put(None)
            writer.join(10)

    def __len__(self) -> int:
        return len(self._waiting)

    def park(self, d: Delivery, queue: str, wake_at: float, reason: str) -> Outcome:
        """Park *d* in *queue* until *wake_at*. On the loop, with a ``later`` to take the
        outcome, it joins the next batch: ASKED now, then PARKED (acked) or DEFER (not acked,
        tried again) to ``later`` once the batch is committed. Otherwise (or delivered again by
        the broker) it is parked at once, alone: PARKED (the outage, if one was reported, is
        over), or DEFER if its row is being woken right now."""
        opts = d.opts
        park: dict[str, Any] = {
            "task_name": str(d.task.name), "queue": queue, "wake_at": wake_at, "reason": reason,
            "priority": opts.priority if opts else 0, "key": opts.key if opts else None}
        if d.later is None or self._hub is None or (d.message.delivery_info or {}).get("redelivered"):
            # Delivered again (rare): alone, as it may meet a row woken since (park.py).
            if not self.parker.park(d.message, ack=d.ack, **park):
                return Outcome.DEFER
            self.outage.recovered()  # the parking database took it
            return Outcome.PARKED
        parked = parked_of(d.message, task_id=d.task_id, now=self.clock(), **park)
        if self.floods is not None:
            self.floods.parked(queue)  # the drainer may take its backlog in bulk
        raised = self._qos is not None and self._raised < self.most
        if raised:
            self._raised += 1
            self._qos.increment_eventually()  # its window place, back while it waits
        self._waiting.append(_Waiting(d, parked, park, raised))
        if len(self._waiting) == 1 and not self._writing:
            self._hub.call_soon(self._send)  # at the end of this turn: its other denials too
        return Outcome.ASKED

    # -- the batch's way: loop -> writer -> loop ---------------------------------------------
    def _send(self) -> None:
        if self._writing or not self._waiting or self._hub is None or self._timer is not None:
            return
        now = time.monotonic()
        wait = self._started + self.every - now
        if wait > 0 and len(self._waiting) < self.most:
            self._timer = self._hub.call_later(wait, self._timed)  # the denials until then too
            return
        self._started = now
        batch, self._waiting, self._writing = self._waiting, [], True
        if self._writer is None:
            self._writer = threading.Thread(target=self._write, name="flowcontrol-parks",
                                            daemon=True)
            self._writer.start()
        # Read here, on the loop: whether the writer may ack what it commits (none acked yet).
        together = None if any(w.d.state.acked for w in batch) \
            else AckTogether.of([w.d.message for w in batch])
        self._inbox.put((self._hub, self._generation, batch, together))

    def _timed(self) -> None:
        self._timer = None
        self._send()

    def _write(self) -> None:
        """The writer thread: commit each batch, ack what it stored where it can (module
        docstring), and hand the results back to its loop."""
        while (item := self._inbox.get()) is not None:
            hub, generation, batch, together = item
            results: list[bool | ParkingRejectedError] | ParkingUnavailableError
            try:
                crashpoint("park.before_commit")
                results = self.store.park_many([w.parked for w in batch])
            except ParkingUnavailableError as exc:
                results = exc
            except Exception as exc:  # a bug must not lose the batch: none is acked
                logger.exception("flowcontrol: parking a batch failed")
                results = ParkingUnavailableError(str(exc))
            acked = together is not None and self._ack(together, batch, results)
            hub.call_soon(self._done, generation, batch, results, together if acked else None)

    @staticmethod
    def _ack(together: AckTogether, batch: list[_Waiting],
             results: list[bool | ParkingRejectedError] | ParkingUnavailableError) -> bool:
        """On the writer: ack the messages whose rows *results* say are committed; False if
        none was acked (the loop acks them, one by one, as Celery would)."""
        if isinstance(results, ParkingUnavailableError):
            return False
        stored = [w.d.message for w, result in zip(batch, results, strict=True) if result is True]
        if not stored:
            return False
        crashpoint("park.committed")
        try:
            together.send(stored)  # only now: their rows are committed
        except Exception as exc:  # the broker's connection: each ack alone logs it, as Celery does
            logger.debug("flowcontrol: acking %d parked messages failed (%r); one by one",
                         len(stored), exc)
            return False
        crashpoint("park.acked")
        return True

    def _done(self, generation: int, batch: list[_Waiting],
              results: list[bool | ParkingRejectedError] | ParkingUnavailableError,
              acked: AckTogether | None = None) -> None:
        """On the loop: ack what the batch committed (or record the writer's acks of it:
        *acked*), and decide the rest."""
        if generation != self._generation:
            if acked is not None and not isinstance(results, ParkingUnavailableError):
                # Parked for good (acked by the writer), its consumer stopped since.
                rows = [w.parked for w, result in zip(batch, results, strict=True) if result is True]
                for row in rows:
                    self.parker.stored(row)
                self.parker.committed(rows)
            return  # its consumer stopped: the broker has the others back
        self._writing = False
        raised = sum(w.raised for w in batch)
        if raised and self._qos is not None:
            self._raised -= raised
            self._qos.decrement_eventually(raised)
        if isinstance(results, ParkingUnavailableError):
            for w in batch:  # none acked: none is committed
                w.decided(self.outage.defer("parking database", results))
        else:
            self.outage.recovered()
            self.batches += 1
            stored = [w for w, result in zip(batch, results, strict=True) if result is True]
            if acked is not None:  # by the writer, after the commit
                acked.record([w.d.message for w in stored])
                for w in stored:
                    w.d.state.acked = True
            else:
                if stored:
                    crashpoint("park.committed")
                _ack_all([w.d for w in stored])  # only now: their rows are committed
                if stored:
                    crashpoint("park.acked")
            for w in stored:
                self.parker.stored(w.parked)
                w.decided(Outcome.PARKED)
            self.parker.committed([w.parked for w in stored])  # one result-backend write
            for w, result in zip(batch, results, strict=True):
                if result is not True:
                    w.decided(self._alone(w))
        self._send()  # what waited meanwhile is the next batch

    def _alone(self, w: _Waiting) -> Outcome:
        """Park *w* by itself, as a park outside a batch: a row refused (dead-lettered), or one
        stored already (a redelivery is acked, the copy of a row being woken is not)."""
        try:
            parked = self.parker.park(w.d.message, ack=w.d.ack, **w.park)
        except ParkingUnavailableError as exc:
            return self.outage.defer("parking database", exc)
        except Exception:
            # A bug must not lose the message: it stays unacked and is tried again.
            logger.exception("flowcontrol: parking task %s failed; retrying later",
                             w.parked.task_id)
            return Outcome.DEFER
        return Outcome.PARKED if parked else Outcome.DEFER


def _ack_all(ds: list[Delivery]) -> None:
    """Ack each of *ds* once (as :meth:`Delivery.ack`), all in one round trip where the
    transport would make one each (kombu_redis.py's ``ack_together``), else one by one."""
    first = [d for d in ds if not d.state.acked]
    if len(first) > 1 and _acked_together(first):
        ds = [d for d in ds if d.state.acked and d not in first]  # acked before: logged there
    for d in ds:
        d.ack()  # one by one (a second ack is logged and skipped)


def _acked_together(ds: list[Delivery]) -> bool:
    try:
        if not ack_together([d.message for d in ds]):
            return False
    except Exception as exc:  # the broker's connection: each ack alone logs it, as Celery does
        logger.debug("flowcontrol: acking %d messages together failed (%r); one by one", len(ds), exc)
        return False
    for d in ds:
        d.state.acked = True
    return True
