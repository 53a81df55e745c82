"""The clock operators' ages are read by: the admission backend's own, when it has one."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["backend_now"]


def backend_now(fc: Any) -> float:
    """Now, by the backend's clock when it has one (ages must not mix two machines' clocks)."""
    clock = getattr(fc.backend, "clock", None)
    return float(clock()) if callable(clock) else time.time()
