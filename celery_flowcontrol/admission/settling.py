"""The quota steps of one flow queue's state: settle a cost, offer a refund's room, pause,
override the rate limits.

A mixin of :class:`~.queue_state.QueueState` (kept apart so each part stays one idea): the
steps that correct what an admission charged (``settle_cost``) and pause the queue or a key
(``FlowBackoff``, ``backoff()``), in the terms of the state's busy slots, grants and lines.

Why a settle is applied at once rather than riding the release: a task settles when it knows
its true cost, usually just before it returns, but its slot may be held much longer (a
``release="manual"`` slot, a slow result backend, a retry); applied at once, a refund is room
that waiters can use now (it wakes one: :meth:`QuotaSteps._offer`), an overdraft pushes the
next admissions out now rather than after they were let in, a second call fails where it is
made, and a worker that dies after settling loses nothing. The price is one more round trip
per task that settles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..config import QueueConfig, RateLimit
from ..errors import SettleError
from .busy import BusySlots
from .quota import Charge, Quota, check_actual, check_backoff
from .values import Grant, Waiter


class QuotaSteps:
    """Settle and backoff, for a state with ``busy``, ``quota``, ``grants``, ``capacity``,
    ``next_waiter`` and ``_grant`` (:class:`~.queue_state.QueueState`)."""

    busy: BusySlots
    quota: Quota
    grants: Any
    config: QueueConfig
    rate_override: tuple[RateLimit, ...] | None
    _emit: Callable[[Grant], None]

    @property
    def capacity(self) -> int | None:
        """The figure in force: the operator's override, else the config's concurrency."""
        raise NotImplementedError

    def next_waiter(self, now: float) -> Waiter | None:
        raise NotImplementedError

    def _grant(self, w: Waiter, now: float) -> None:
        raise NotImplementedError

    def effective(self, config: QueueConfig) -> QueueConfig:
        """*config* with the operator's rate limits, while they are set."""
        if self.rate_override is None:
            return config
        return replace(config, rate_limit=self.rate_override)

    def set_rate_override(self, rates: tuple[RateLimit, ...] | None) -> None:
        """The queue's rate limits are *rates* from now on (``None``: its config's again);
        windows whose limits change start anew."""
        self.rate_override = rates
        self.quota.configure(self.effective(self.config))

    def rate_used(self, now: float) -> float:
        """The use of the queue's first rate limit (``QueueStats.rate_used``)."""
        windows = self.quota.windows
        return windows[0].used(now) if windows else 0

    def settle(self, slot_id: str, actual: object, now: float) -> float:
        """Correct the cost charged when *slot_id* was admitted to *actual*, in every
        ``per="cost"`` window (see :meth:`AdmissionBackend.settle`); the correction made.
        A refund there is offered to a waiter at once (:meth:`_offer`)."""
        actual = check_actual(slot_id, actual)
        charge = self.busy.charges.get(slot_id)
        if slot_id not in self.busy.slots:
            raise SettleError("is not busy: released, reclaimed, or never admitted", slot_id)
        if charge is None:
            charge = self.busy.charges[slot_id] = Charge(1, self.busy.slots[slot_id].fairness_key,
                                                        (), (), (-1, -1))
        if charge.settled:
            raise SettleError("was settled already: settle_cost is once per admission", slot_id)
        if self.quota.settle(charge, actual, now):
            self._offer(now)
        return actual - charge.cost

    def _offer(self, now: float) -> None:
        """Room came back in the rate limits: wake a waiter now rather than at its retry.
        The oldest pending grant is announced again; a queue without a concurrency cap (so
        without grants) grants its next waiter, which only wakes it (free is unbounded)."""
        if self.grants.expiry:
            self._emit(self.grants.by_task[self.grants.expiry[0][1]].grant)
        elif self.capacity is None:
            w = self.next_waiter(now)
            if w is not None:
                self._grant(w, now)

    def backoff(self, seconds: object, key: object, now: float) -> float:
        """Admit nothing of this queue (or of fairness key *key*) for *seconds*; the end."""
        return self.quota.backoff(check_backoff(self.config.name, seconds, key),
                                  key if isinstance(key, str) else None, now)
