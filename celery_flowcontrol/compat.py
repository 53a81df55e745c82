"""The one place that reaches past Celery's and kombu's public API, and why.

Each function here reads something a supported Celery or kombu gives no public way to, or
gives differently from one release to the next (setup.cfg's floors to the newest), so the
modules that need it stay on public names. (redis-py's are in ``admission/redis/redispy.py``:
the admission layer imports nothing of Celery's.)

``pool_size(pool)``
    How many tasks a worker pool runs at once. Celery before 5.7 gives a gevent pool's
    *running* greenlets as ``num_processes`` (``len(self._pool)``), and its ``grow`` and
    ``shrink`` change only the size of the ``gevent.pool.Pool`` it keeps as ``_pool``: an
    autoscaler reading ``num_processes`` saw a pool of 4 as one of 0 and grew it every
    tick. gevent's ``Pool.size`` is the size on every Celery from 5.3 on.
``resized(pool)``
    After a ``grow`` or ``shrink``: Celery before 5.7 leaves a gevent pool's ``limit``, the
    ``max-concurrency`` that ``celery inspect stats`` shows, at the size it started with;
    this sets it to the size, as Celery 5.7's own ``grow`` and ``shrink`` do.
``unaccepted_jobs(pool)``
    Whether a prefork pool has written a job to a child that has not accepted it yet:
    billiard counts such a child as idle, and ``shrink`` may remove it, losing the job
    (``WorkerLostError``). billiard's pool keeps its jobs in ``_cache`` and each job's
    ``_accepted``.
``exchange_table(channel, exchange)``
    The path of a filesystem-transport exchange's binding table: kombu 5.7's
    ``Channel._exchange_file`` (which also refuses names that would leave the control
    folder), or the path kombu 5.3 to 5.6 build inline.

``tests/unit/test_compat.py`` holds each to what its caller relies on, on the installed
Celery and kombu, so a release that changes one fails there, by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["exchange_table", "pool_size", "resized", "unaccepted_jobs"]


def _gevent_size(pool: Any) -> int | None:
    if type(pool).__module__ != "celery.concurrency.gevent":
        return None
    size = getattr(getattr(pool, "_pool", None), "size", None)
    return size if isinstance(size, int) else None


def pool_size(pool: Any) -> int:
    """How many tasks Celery worker pool *pool* runs at once (its size, not how many run)."""
    size = _gevent_size(pool)
    return int(pool.num_processes) if size is None else size


def resized(pool: Any) -> None:
    """After *pool* grew or shrank: a gevent pool's ``limit`` (its ``max-concurrency`` in
    ``inspect stats``) follows its size. Other pools are left as Celery keeps them."""
    size = _gevent_size(pool)
    if size is not None and pool.limit != size:
        pool.limit = size


def unaccepted_jobs(pool: Any) -> bool:
    """True while prefork pool *pool* has a job written to a child that hasn't accepted it."""
    cache = getattr(getattr(pool, "_pool", None), "_cache", None) or {}
    return any(not getattr(job, "_accepted", True) for job in list(cache.values()))


def exchange_table(channel: Any, exchange: str) -> Path:
    """The binding table file of *exchange* on kombu filesystem channel *channel*."""
    own = getattr(channel, "_exchange_file", None)
    if own is not None:
        return Path(own(exchange))
    return Path(channel.control_folder) / f"{exchange}.exchange"
