"""``will_finish``: after a broker reconnect, which admitted requests Celery dropped unrun.

Pure logic over the attributes Celery and billiard keep (``Request._apply_result``, the
prefork pool's job cache): stand-ins here; the real thing is
tests/chaos/test_services.py::test_a_reconnect_gives_back_the_slots_of_what_celery_dropped_unrun.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker.state import active_requests

from celery_flowcontrol.worker.release import will_finish


class Job:
    """billiard's ApplyResult, as far as will_finish looks: its id and the pool's cache."""

    def __init__(self, cache: dict[int, Any], job_id: int) -> None:
        self._job, self._cache = job_id, cache
        cache[job_id] = self


class Req:
    _apply_result: Any = None


def prefork(cache: dict[int, Any]) -> Any:
    return SimpleNamespace(_pool=SimpleNamespace(_cache=cache))


@pytest.fixture
def active() -> Iterator[set[Any]]:
    yield active_requests
    active_requests.clear()


def test_a_request_a_pool_process_took_finishes(active: set[Any]) -> None:
    req = Req()
    active.add(req)
    assert will_finish(req, prefork({}))


def test_a_request_never_handed_to_the_pool_was_dropped(active: set[Any]) -> None:
    # Waiting for a pool process (the semaphore), in a rate-limit bucket, on the ETA timer.
    assert not will_finish(Req(), prefork({}))
    assert not will_finish(Req(), SimpleNamespace())


def test_a_job_still_in_the_prefork_cache_finishes_one_taken_out_was_dropped(active: set[Any]) -> None:
    cache: dict[int, Any] = {}
    kept, discarded = Req(), Req()
    job = Job(cache, 1)
    kept._apply_result = weakref.ref(job)
    gone = Job(cache, 2)
    discarded._apply_result = weakref.ref(gone)
    del cache[2]  # AsynPool.flush: not accepted, so discarded
    assert will_finish(kept, prefork(cache))
    assert not will_finish(discarded, prefork(cache))
    del gone  # and nothing else held it
    assert not will_finish(discarded, prefork(cache))


def test_a_pool_without_a_job_cache_runs_what_it_was_handed(active: set[Any]) -> None:
    # The threads pool: its ApplyResult wrapper is gone at once, the job still runs.
    req = Req()
    req._apply_result = weakref.ref(Job({}, 1))
    assert will_finish(req, SimpleNamespace(_pool=None))
