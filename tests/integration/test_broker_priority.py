"""flow_priority on a real Redis broker: the order kombu serves one broker queue in.

README ("flow_priority is also mapped onto the broker's own priority") says what this pins: on
Redis a message without a priority counts as 0, the first served, so a FlowTask at the default
flow priority (broker priority 9) is fetched after the plain tasks of its broker queue; a higher
flow priority moves it up among flow tasks, and Celery's own ``priority=`` wins.
"""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery

from celery_flowcontrol import FlowControl, FlowTask


def served_order(app: Celery, queue: str, n: int) -> list[str]:
    """The task ids kombu hands out of *queue*, one ``basic_get`` at a time (as a worker
    fetches: the lowest priority step first, FIFO within a step)."""
    order = []
    with app.connection_for_read() as conn:
        channel = conn.default_channel
        for _ in range(n):
            message: Any = channel.basic_get(queue, no_ack=True)
            assert message is not None, f"only {len(order)} of {n} messages in {queue}"
            order.append(message.headers["id"])
    return order


def test_redis_serves_plain_tasks_before_default_flow_tasks(redis_url: str, redis_client: redis.Redis,
                                                            key_prefix: str) -> None:
    app = Celery("prio", broker=redis_url, set_as_current=False)
    FlowControl(app)
    queue = f"{key_prefix}-q"

    @app.task(base=FlowTask, flow_queue="api", shared=False)
    def flow() -> None: ...

    @app.task(shared=False)
    def plain() -> None: ...

    sent = [
        flow.apply_async(queue=queue, task_id="flow-default"),  # broker priority 9
        flow.apply_async(queue=queue, task_id="flow-5", flow_priority=5),  # 4: step 3
        plain.apply_async(queue=queue, task_id="plain"),  # none: 0
        flow.apply_async(queue=queue, task_id="flow-own", priority=0),  # Celery's own wins
        flow.apply_async(queue=queue, task_id="flow-9", flow_priority=9),  # 0
    ]
    assert served_order(app, queue, len(sent)) == ["plain", "flow-own", "flow-9", "flow-5", "flow-default"]
