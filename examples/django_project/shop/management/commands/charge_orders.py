"""``python manage.py charge_orders [N]``: send N charges, wait for them, and say how many
ran at once (a worker must run: ``celery -A proj worker``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from shop.tasks import charge


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most (start, end) spans open at once."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    peak = now = 0
    for _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


class Command(BaseCommand):
    help = "Charge N orders through the flow queue 'payments' and report the concurrency."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("orders", nargs="?", type=int, default=8)

    def handle(self, *args: Any, orders: int, **options: Any) -> None:
        capacity = settings.CELERY_FLOWCONTROL_QUEUES[0]["concurrency"]
        results = [charge.delay(n) for n in range(orders)]
        spans = [tuple(r.get(timeout=120)) for r in results]
        peak = most_at_once(spans)
        self.stdout.write(f"django_project: {len(spans)} orders charged, at most {peak} at once "
                          f"(capacity {capacity})")
        if peak > capacity:
            raise CommandError(f"the cap of {capacity} was exceeded: {peak} at once")
