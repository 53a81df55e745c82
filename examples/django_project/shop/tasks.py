"""The app's Celery tasks, found by ``app.autodiscover_tasks()`` (proj/celery.py)."""

from __future__ import annotations

import time

from celery import shared_task

from celery_flowcontrol import FlowTask


@shared_task(base=FlowTask, flow_queue="payments")
def charge(order_id: int) -> tuple[float, float]:
    """Charge one order at the payment provider; the call's (start, end)."""
    start = time.time()
    time.sleep(0.3)  # the provider's API call
    return start, time.time()
