"""Report exports: one heavy export at a time, and a caller that will not wait forever.

``export_report`` calls ``acquire_slot("exports", timeout=...)`` first thing. With the only
slot busy, the task is parked (no pool process waits) and runs again from the start when the
slot is granted; ``acquire_slot`` then returns the slot, which is released when the task
ends. When ``timeout`` passes first, it raises ``SlotTimeoutError`` instead and the waiter
leaves the line. Code before ``acquire_slot`` runs again after a wait: call it first.

Run ``python examples/report_export.py``: a 2 s export holds the slot; a patient export
(timeout 1 min) runs after it; an impatient one (timeout 0.5 s) gives up.
"""

from __future__ import annotations

import sys
import time

from _run import make_app, worker

from celery_flowcontrol import FlowTask, SlotTimeoutError, acquire_slot

app = make_app("report_export", [{"name": "exports", "concurrency": 1, "retry": 0.25}])


@app.task(base=FlowTask)
def export_report(report: str, seconds: float, timeout: float) -> str:
    """Build one report while holding the only export slot."""
    acquire_slot("exports", timeout=timeout, label=report)
    time.sleep(seconds)  # the export itself
    return f"{report}.csv"


def main() -> int:
    with worker(app, concurrency=3):
        big = export_report.delay("yearly", 2.0, 60)
        time.sleep(0.5)  # let it take the slot
        patient = export_report.delay("monthly", 0.1, 60)
        impatient = export_report.delay("daily", 0.1, 0.5)
        impatient.get(timeout=60, propagate=False)
        outcome = {r: a.get(timeout=60) for r, a in (("yearly", big), ("monthly", patient))}
    gave_up = SlotTimeoutError.is_(impatient.result)
    print(f"report_export: exported {sorted(outcome.values())}, daily gave up: {gave_up} ({impatient.result})")
    return 0 if gave_up and len(outcome) == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
