"""``flow_group``: a group with at most N members in flight across the fleet.

::

    result = flow_group(resize.s(size=512), image_ids, concurrency=50)
    result.get()  # a GroupResult, as group(...).apply_async() returns

Every member is published at once to an ephemeral flow queue of concurrency N; no parent task
holds state in memory, and members over the cap are parked like any denied task. The queue
is named ``fg.<id>.<N>``: it describes itself, so any worker can (re)create it, and it is
removed when the last member finishes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from celery import group

from .config import MAX_CONCURRENCY
from .errors import FlowControlConfigError, FlowControlError


def flow_group(signature: Any, items: Iterable[Any], concurrency: int) -> Any:
    """Apply *signature* once per item (a tuple is the args, anything else the one arg), at
    most *concurrency* at a time fleet-wide; returns the GroupResult."""
    from .task import FlowTask

    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not (
            1 <= concurrency <= MAX_CONCURRENCY):
        raise FlowControlConfigError(
            f"must be an int between 1 and {MAX_CONCURRENCY}, got {concurrency!r}", None,
            "concurrency")
    task = signature.type
    if not isinstance(task, FlowTask):
        raise FlowControlError(f"flow_group() needs a task with base=FlowTask, got {task!r}")
    name = f"fg.{uuid.uuid4().hex[:12]}.{concurrency}"
    members = [signature.clone(args=item if isinstance(item, tuple) else (item,))
               .set(flow_queue=name) for item in items]
    return group(members).apply_async()
