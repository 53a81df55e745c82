"""The drainer: a flooded flow queue's backlog taken out of the broker in bulk, beside Celery's consumer.

Under a flood the consumer parks what it denies (parkbatch.py), but it takes its messages one at
a time: on kombu's Redis transport a ``BRPOP`` round trip and a blocking ``QoS.append``
pipeline each, and Celery decodes each into a request. A backlog of one queue drains no faster
than that, whatever the parking table takes. So while a flow queue is flooded on this worker
(the batches parked its denials lately: they are parked, not kept lingering) and its backlog
belongs in the parking table (an ordered queue, or a line that stands still: docs/worker.md, "A
flood"), the drainer thread of the worker instance takes that queue's oldest messages off
the broker's lists, up to :data:`MOST` in one atomic step (:class:`..kombu_redis.BrokerLists`,
which records each as kombu's own QoS does), asks admission for all of them in one round trip
(``try_admit_many``, with the tickets the gate would ask with), parks the denied ones in one
transaction and acks them in one round trip.

What holds, as for the consumer's parks:

* nothing is acked before its row is committed; a commit that fails gives every message back;
* a message the drainer does not decide in bulk goes back to the consumer, at the tail of its
  list (the next it takes), which decides it as any other: a list is left at its first message
  of another queue or with anything more than the plain flow options (an ETA, an expiry,
  collapse options, ``acquire_slot``, a second delivery, a wake's copy), so the consumer's own
  order is never changed; and an unknown task, one admission let in (its slot is released at
  once, for the next waiter; the queue's line moves, so the drainer stops there), one refused
  by a waiting bound, a row the batch did not store;
* a taken message sits in kombu's unacked hash and index as a delivered one does: a node that
  dies holding it gets it back by kombu's visibility restore (``visibility_timeout``), and a
  redelivery that meets its committed row becomes one run with it (park.py);
* the consumer stops (a warm shutdown, a reconnect): :meth:`Drainer.detach` waits for the batch
  in hand, which ends parked and acked or given back: nothing it took stays unacked.

Only kombu's Redis transport has lists to take from; elsewhere there is nothing to attach to, and
the consumer's own path is the whole drain. It runs only with ``flowcontrol_bulk_drain``: a bulk
is admitted beside the consumer's own asks, so within one priority or key the line's arrival
order is approximate (up to about a prefetch window: docs/worker.md, "A flood").
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..admission.base import AdmissionBackend, Admitted, Denied, Ticket
from ..config import QueueConfig
from ..errors import (
    CostRefusedError,
    FlowControlError,
    InvalidTicketError,
    ParkingUnavailableError,
    UnknownQueueError,
)
from ..parking import ParkedMessage, ParkingStore
from ..protocol import (
    COST_HEADER,
    KEY_HEADER,
    LABEL_HEADER,
    PRIORITY_HEADER,
    QUEUE_HEADER,
    FlowOptions,
    read_options,
    ticket_id,
)
from .crashpoints import crashpoint
from .message import parked_of

if TYPE_CHECKING:
    from ..kombu_redis import BrokerLists, Taken
    from .ledger import Ledger
    from .linger import Lingering
    from .park import Parker
    from .release import Releases

__all__ = ["MOST", "Drainer", "Floods"]

logger = logging.getLogger(__name__)

#: Messages at most taken in one step.
MOST = 200
#: Seconds a queue counts as flooded after a batch of the consumer's last parked one of it.
FLOODED_FOR = 1.0
#: Seconds the drainer waits after a step that found nothing to do, or failed.
PAUSE = 0.02
BACK_OFF = 1.0
#: The flow headers a message taken in bulk may carry: the plain flow options.
PLAIN = frozenset((QUEUE_HEADER, PRIORITY_HEADER, KEY_HEADER, LABEL_HEADER, COST_HEADER))


class Floods:
    """Which flow queues this worker parks the denials of: told by the consumer's path
    (parkbatch.py, on the loop), read by the drainer (its thread)."""

    def __init__(self) -> None:
        self.event = threading.Event()  # set at a park: the drainer looks again
        self._at: dict[str, float] = {}  # queue -> monotonic time of its last batched park

    def parked(self, queue: str) -> None:
        """A denial of *queue* joined a batch of parks."""
        self._at[queue] = time.monotonic()
        if not self.event.is_set():
            self.event.set()

    def since(self, queue: str) -> float:
        """The monotonic time *queue* last had a denial parked (``-inf``: never)."""
        return self._at.get(queue, -math.inf)

    def flooded(self) -> list[str]:
        """The queues whose denials were parked within :data:`FLOODED_FOR`."""
        now = time.monotonic()
        return [q for q, at in list(self._at.items()) if now - at < FLOODED_FOR]


@dataclass(slots=True, eq=False)
class _Item:
    taken: Taken
    message: Any
    task: Any
    opts: FlowOptions


class Drainer:
    """The bulk drain of one worker instance (module docstring); its own thread."""

    def __init__(self, *, floods: Floods, tasks: Mapping[str, Any], backend: AdmissionBackend,
                 store: ParkingStore, parker: Parker, releases: Releases, ledger: Ledger,
                 lingering: Lingering, configs: Callable[[str], QueueConfig | None],
                 instance: str, clock: Callable[[], float], most: int = MOST) -> None:
        self.floods = floods
        self.tasks = tasks
        self.backend = backend
        self.store = store
        self.parker = parker
        self.releases = releases
        self.ledger = ledger
        self.lingering = lingering
        self.configs = configs
        self.instance = instance
        self.clock = clock
        self.most = most
        self.drained = 0  # messages taken in bulk and parked
        self.given_back = 0  # messages taken in bulk and given back to the consumer
        self._lists: BrokerLists | None = None
        self._busy = threading.Lock()  # held for a whole step: detach waits for it
        self._halt = threading.Event()
        self._stopped: dict[str, float] = {}  # queue -> when the drainer last stopped there
        self._thread: threading.Thread | None = None
        self._failing = False  # a step failed: logged once until one goes through

    def attach(self, lists: BrokerLists | None) -> None:
        """Drain from *lists* (the consumer's, on kombu's Redis transport; None elsewhere)."""
        self.detach()
        with self._busy:
            self._lists = lists
        if lists is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="flowcontrol-drain", daemon=True)
            self._thread.start()

    def detach(self) -> None:
        """The consumer stops: once the step in hand is parked or given back, take no more."""
        if self._busy.acquire(timeout=30):
            self._lists = None
            self._busy.release()
        else:  # a step stuck on a service: what it holds comes back by kombu's restore
            self._lists = None
            logger.warning("flowcontrol: the drainer's step did not end in 30 s; its messages "
                           "come back after the broker's visibility timeout")

    def close(self) -> None:
        """Stop the thread (after the step in hand)."""
        self.detach()
        self._halt.set()
        self.floods.event.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(10)

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._halt.is_set():
            self.floods.event.wait(1.0)
            self.floods.event.clear()
            while not self._halt.is_set() and (queues := self._queues()):
                try:
                    with self._busy:
                        lists = self._lists
                        stop = set(queues) if lists is None else self.step(lists, queues)
                except Exception:  # the thread must not die of one step: nothing was acked
                    logger.exception("flowcontrol: a drain step failed")
                    stop = set(queues)
                    self._halt.wait(BACK_OFF)
                now = time.monotonic()
                for q in stop:
                    self._stopped[q] = now
            self._halt.wait(PAUSE)

    def _queues(self) -> list[str]:
        """The queues to drain now: flooded (the consumer parks their denials: no lingering
        place was free, or the line stands still), parked in since the drainer last stopped
        there, and whose backlog belongs in the parking table: an ordered queue's, or one whose
        line does not move (a FIFO queue's moving line keeps its backlog in the broker, in the
        backend's own order: docs/worker.md, "A flood")."""
        if self._lists is None:
            return []
        return [q for q in self.floods.flooded()
                if self.floods.since(q) > self._stopped.get(q, -math.inf)
                and (self.lingering.drains(q, self.configs(q)) or not self.lingering.moving(q))]

    # -- one step ------------------------------------------------------------------------------
    def step(self, lists: BrokerLists, queues: list[str]) -> set[str]:
        """Take, decide, park and ack one bulk of *queues*' messages; the queues to stop at."""
        taken = lists.take(queues, self.most, PLAIN)
        if not taken:
            return set(queues)
        crashpoint("drain.taken")
        order = {id(t): n for n, t in enumerate(taken)}
        settled: list[Taken] = []  # parked and acked, or given back: not the consumer's again
        try:
            stop, back = self._decide(lists, taken, queues, settled)
        except BaseException:
            # A bug, or the thread stopped: nothing unsettled may stay in the unacked hash.
            done = {id(t) for t in settled}
            lists.give_back([t for t in taken if id(t) not in done])
            raise
        if back:
            lists.give_back(sorted(back, key=lambda t: order[id(t)]))
            self.given_back += len(back)
        return stop

    def _decide(self, lists: BrokerLists, taken: list[Taken], queues: list[str],
                settled: list[Taken]) -> tuple[set[str], list[Taken]]:
        stop = set(queues) if len(taken) < self.most else set()
        items, back = self._read(lists, taken, queues)
        try:
            rows, more_back, admitted = self._admit(items)
        except (CostRefusedError, InvalidTicketError, UnknownQueueError) as exc:
            # A ticket the backend takes from no one as asked: the consumer's path decides
            # each (a cost no admission takes is dead-lettered there, a lost queue re-created).
            logger.debug("flowcontrol: a bulk goes back to the consumer (%r)", exc)
            return set(queues), list(taken)
        except FlowControlError as exc:  # the backend: the consumer's path asks them again
            self._failed("admission backend", exc)
            return set(queues), list(taken)
        back += more_back
        stop |= admitted
        stored, refused, failed = self._park(lists, rows, settled)
        if failed:
            return set(queues), back + [t for t, _ in rows]
        self.drained += len(stored)
        if not stored:
            # Nothing parked: what goes back would be the next bulk's again (it is at the
            # tail); the consumer decides it first.
            stop = set(queues)
        return stop, back + refused

    def _read(self, lists: BrokerLists, taken: list[Taken], queues: list[str]
              ) -> tuple[list[_Item], list[Taken]]:
        """Each taken message as the gate would read it; what can't be decided here goes back."""
        items, back = [], []
        for t in taken:
            message = task = opts = None
            try:
                message = lists.to_message(t)
                task = self.tasks.get(str(message.headers.get("task")))
                opts = read_options(message.headers, task) if task is not None else None
            except Exception:  # an odd message: the consumer's path decides it
                logger.debug("flowcontrol: a message taken in bulk is not read here", exc_info=True)
            if opts is None or opts.queue not in queues or not math.isfinite(opts.cost) \
                    or opts.eta is not None or opts.expires is not None:
                back.append(t)
                continue
            self.lingering.seen(opts)  # a flow_priority: its order is not the broker's (linger.py)
            items.append(_Item(t, message, task, opts))
        return items, back

    def _admit(self, items: list[_Item]) -> tuple[list[tuple[Taken, ParkedMessage]], list[Taken], set[str]]:
        """Admission for all of *items* in one round trip, with the gate's tickets (admitter.py):
        the rows of the denied ones, the ones given back, the queues where one was admitted."""
        tickets = [Ticket(i.opts.queue, ticket_id(i.message.headers), self.instance, i.opts.priority,
                          i.opts.key, i.opts.label, i.opts.cost) for i in items]
        for queue in {i.opts.queue for i in items}:
            self.ledger.asked(queue)  # a waiter of ours there (holdings.py)
        decisions = self.backend.try_admit_many(tickets) if tickets else []
        rows, back, admitted = [], [], set()
        now = self.clock()
        for i, decision in zip(items, decisions, strict=True):
            if isinstance(decision, Denied):
                rows.append((i.taken, parked_of(
                    i.message, task_id=str(i.message.headers.get("id")), queue=i.opts.queue,
                    task_name=str(i.task.name), priority=i.opts.priority, key=i.opts.key,
                    wake_at=decision.retry_at, reason=decision.reason, now=now)))
                continue
            if isinstance(decision, Admitted):
                # Its line moved: the slot goes to the next waiter now, the message to the
                # consumer, which asks again (and runs it, if it is still its turn).
                self.releases.release(decision.slot.slot_id, decision.slot.queue)
                self.lingering.moved(i.opts.queue)
                admitted.add(i.opts.queue)
            back.append(i.taken)  # refused: the consumer's path ends it as it does any
        return rows, back, admitted

    def _park(self, lists: BrokerLists, rows: list[tuple[Taken, ParkedMessage]],
              settled: list[Taken]) -> tuple[list[ParkedMessage], list[Taken], bool]:
        """Commit *rows* in one transaction, then ack their messages in one round trip: the
        rows stored, the messages whose row was not stored, and whether the commit failed."""
        if not rows:
            return [], [], False
        try:
            crashpoint("park.before_commit")
            results = self.store.park_many([row for _, row in rows])
        except ParkingUnavailableError as exc:
            self._failed("parking database", exc)
            return [], [], True
        stored = [(t, row) for (t, row), r in zip(rows, results, strict=True) if r is True]
        refused = [t for (t, _), r in zip(rows, results, strict=True) if r is not True]
        if stored:
            crashpoint("park.committed")
            crashpoint("drain.committed")
            try:
                settled += [t for t, _ in stored]  # committed: never given back now
                lists.ack([t for t, _ in stored])  # only now: their rows are committed
            except Exception as exc:  # the broker: they come back by kombu's restore, and
                # each redelivery meets its row (park.py)
                logger.warning("flowcontrol: acking %d messages parked in bulk failed (%r)",
                               len(stored), exc)
            else:
                crashpoint("park.acked")
        for _, row in stored:
            self.parker.stored(row)
        self.parker.committed([row for _, row in stored])
        if self._failing:
            logger.warning("flowcontrol: the drainer parks again")
            self._failing = False
        return [row for _, row in stored], refused, False

    def _failed(self, what: str, exc: Exception) -> None:
        if not self._failing:
            logger.error("flowcontrol: %s unreachable (%s); the drainer gives its messages back "
                         "to the consumer", what, exc)
        self._failing = True
        self._halt.wait(BACK_OFF)
