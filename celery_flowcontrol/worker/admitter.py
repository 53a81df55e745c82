"""One admission call of the gate (gate.py), and what it does when the backend can't take it.

The gate asks through :meth:`Admitter.admit`: a ticket of this instance, counted first in the
ledger (``asked``: holdings.py sweeps the queues this instance asked in). A queue the backend
does not know is re-created when its config is known here (a ``flow_group``'s or serial
task's queue, removed when idle, or a configured queue whose state the backend lost) and asked
again; one nobody configured, or input the backend can't take, runs ungated with one warning.
:meth:`Admitter.entry` is the ledger's entry for a slot it gave.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..admission.base import AdmissionBackend, Decision, Slot, Ticket
from ..config import QueueConfig
from ..errors import InvalidTicketError, UnknownQueueError
from ..protocol import ephemeral_config, warn_once
from .ledger import Entry, Ledger
from .reassert import restore_queue

__all__ = ["Admitter"]


class Admitter:
    """The admission calls of one worker instance (the module docstring)."""

    def __init__(self, *, backend: AdmissionBackend, instance: str, ledger: Ledger,
                 configs: Callable[[str], QueueConfig | None]) -> None:
        self.backend = backend
        self.instance = instance
        self.ledger = ledger
        self.config_of = configs

    def admit(self, task: Any, queue: str, tid: str, priority: int, key: str,
              label: str, cost: float = 1) -> Decision | None:
        """One admission call; ``None`` for a queue nobody registered, or for input the
        backend can't take (both run ungated, with one warning)."""
        try:
            ticket = Ticket(queue, tid, self.instance, priority, key, label, cost)
            self.ledger.asked(queue)  # a slot or a waiter of ours there (holdings.py)
            return self.backend.try_admit(ticket)
        except UnknownQueueError:
            # A flow_group's or serial task's queue (removed when idle), or a configured queue
            # whose state the backend lost (a Redis restart without persistence): re-create
            # it, so the cap holds again from this admission on.
            config = ephemeral_config(ticket.queue) or self.config_of(ticket.queue)
            if config is not None:
                # Through restore: its slot ids start past any held from before the loss,
                # and what this instance holds there counts again at once.
                restore_queue(self.backend, self.instance, config, self.ledger)
                return self.backend.try_admit(ticket)
            warn_once("queue", ticket.queue, "flow queue %r is not registered: tasks naming it "
                      "run ungated", ticket.queue)
        except InvalidTicketError as exc:
            warn_once("ticket", str(task.name), "task %s can't be flow-controlled (%s): "
                      "running ungated", task.name, exc)
        return None

    def entry(self, slot: Slot) -> Entry:
        """The ledger's entry for *slot*: released by the task itself when its queue says
        ``release="manual"``."""
        return Entry(slot, (config := self.config_of(slot.queue)) is not None and config.release == "manual")
