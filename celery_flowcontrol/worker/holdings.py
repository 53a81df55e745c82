"""Where this worker instance holds something in the admission backend: its sweeps' index.

The instance's periodic sweeps (waker.py's heartbeat, reclaim pass and pending-grant rescue;
reassert.py's re-assertion and stale check) read the queues of this index, not every
registered queue, so what they cost Redis grows with what the instance holds, not with what
is registered (docs/sizing.md). The eager pass over every queue is the beat task's
(``flowcontrol.reclaim``), once a reclaim interval for the whole fleet.

The index is kept in the worker, from the instance's own decisions, not in the backend: on
Redis Cluster the keys of one queue share its hash slot, so a script deciding in one queue
can't write an index that spans queues; and the instance knows every slot, waiter and grant
it has, since each comes from an admission it asked for. Both halves live in the ledger:

* **held**: the queues of the slots in the ledger, until their tasks finish (the heartbeat
  and the re-assertion need exactly these: a lease lapses only where slots depend on it);
* **asked**: the queues this instance asked admission in within the last *horizon* seconds
  (``waiter_ttl + grant_ttl``; the gate and asking.py record each ask): a denial leaves a
  waiter there and a grant goes to a waiter; a waiter that stops asking is pruned after
  ``waiter_ttl``, an unconfirmed grant passes on after ``grant_ttl``.
"""

from __future__ import annotations

from .ledger import Ledger


class Holdings:
    """The queues where one worker instance holds slots, waits or was granted."""

    def __init__(self, ledger: Ledger, horizon: float = 720.0) -> None:
        self.ledger = ledger
        self.horizon = horizon

    def held(self) -> list[str]:
        """The queues where the ledger holds slots."""
        return list(self.ledger.held())

    def queues(self) -> list[str]:
        """The held queues, then those asked in within the horizon."""
        asked = self.ledger.asked_since(self.ledger.clock() - self.horizon)
        return list(dict.fromkeys([*self.held(), *asked]))
