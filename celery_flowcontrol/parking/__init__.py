"""The parking table: denied messages stored in SQL until they may run, then republished.

``ParkingStore(url)`` is the whole API (park, claim_due, claim, done, unclaim, reads);
``migrate(url)`` creates or upgrades the tables on databases that are not auto-created.
This package imports neither Celery nor the admission engine.
"""

from __future__ import annotations

from .migrate import migrate
from .model import DeadLetter, ParkedMessage, Requeue
from .store import ParkingRejectedError, ParkingStore

__all__ = ["DeadLetter", "ParkedMessage", "ParkingRejectedError", "ParkingStore", "Requeue", "migrate"]
