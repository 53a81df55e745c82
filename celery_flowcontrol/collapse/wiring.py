"""An app's collapse engines: its claims, latest-wins keys and batch counts (beside its
admission backend) and debounce rows.

Claims live where the admission backend keeps its state: in Redis (the backend's own
client and key prefix, so Sentinel and Cluster URLs work alike) when the backend is
:class:`~celery_flowcontrol.admission.RedisBackend`, else in this process. Debounced calls
are rows of the app's parking store.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from ..engines import engines_of, unproxy
from ..parking.debounce import DebounceRows
from .batchstats import BatchStats, MemoryBatchStats, RedisBatchStats
from .claims import Claims, MemoryClaims, RedisClaims
from .latest import LatestKeys, MemoryLatest, RedisLatest

__all__ = ["batch_stats_of", "claims_of", "debounce_rows_of", "latest_of"]

_CLAIMS: weakref.WeakKeyDictionary[Any, Claims] = weakref.WeakKeyDictionary()
_LATEST: weakref.WeakKeyDictionary[Any, LatestKeys] = weakref.WeakKeyDictionary()
_STATS: weakref.WeakKeyDictionary[Any, BatchStats] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
T = TypeVar("T")


def claims_of(app: Any) -> Claims:
    """The claims of *app* (one per app and process, made on first use)."""
    return _per_app(_CLAIMS, app, MemoryClaims, RedisClaims)


def latest_of(app: Any) -> LatestKeys:
    """The latest-wins keys of *app* (one per app and process, made on first use)."""
    return _per_app(_LATEST, app, MemoryLatest, RedisLatest)


def batch_stats_of(app: Any) -> BatchStats:
    """The batch counts of *app* (one per app and process, made on first use)."""
    return _per_app(_STATS, app, MemoryBatchStats, RedisBatchStats)


def _per_app(made: weakref.WeakKeyDictionary[Any, T], app: Any, in_process: Callable[[], T],
             in_redis: Callable[[Any, str], T]) -> T:
    """*app*'s engine of one kind: in Redis beside its admission backend, else in process;
    made once per app and process (*made* keeps it)."""
    app = unproxy(app)
    engine = made.get(app)
    if engine is None:
        with _LOCK:
            engine = made.get(app)
            if engine is None:
                redis = _redis_of(app)
                engine = made[app] = in_process() if redis is None else in_redis(*redis)
    return engine


def _redis_of(app: Any) -> tuple[Any, str] | None:
    """The Redis client and key prefix of *app*'s admission backend, ``None``: in process."""
    engines = engines_of(app)
    backend = engines.backend
    client = getattr(backend, "client", None)
    if not engines.backend_is_local and client is not None and hasattr(backend, "key_prefix"):
        return client, backend.key_prefix
    return None


def debounce_rows_of(app: Any) -> DebounceRows:
    """The pending debounced calls of *app*'s parking store."""
    return DebounceRows(engines_of(app).store)
