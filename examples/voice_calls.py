"""Voice calls: a slot held from "dial" until the provider's webhook says the call ended.

The provider allows 20 calls at once. ``place_call`` runs on the manual flow queue ``calls``
(concurrency 20): its slot stays busy after the task returns, and its id travels with the call
(here: as an argument of the simulated webhook). ``call_ended``, the webhook's task, releases
it, and the next parked ``place_call`` gets the slot at once. A call nobody ends is taken
back after ``max_hold``.

Run ``python examples/voice_calls.py [CALLS]`` (default 60); it prints a one-line summary.
"""

from __future__ import annotations

import random
import sys
import time

from _run import make_app, max_in_flight, worker

from celery_flowcontrol import FlowControlError, FlowTask, release_slot

CONCURRENCY = 20
app = make_app("voice_calls", [{"name": "calls", "concurrency": CONCURRENCY, "release": "manual", "max_hold": "10m"}])


@app.task(base=FlowTask, flow_queue="calls", bind=True)
def place_call(self, number: str) -> tuple[str, str]:
    """Dial; the provider calls our webhook with the slot id when the call ends."""
    slot_id = self.request.flow_slot
    # The simulated provider: the call lasts 0.2-0.5 s, then the webhook fires.
    ended = call_ended.apply_async((slot_id, time.time()), countdown=random.uniform(0.2, 0.5))
    return slot_id, ended.id


@app.task(bind=True, max_retries=5)
def call_ended(self, slot_id: str, placed_at: float, ended_at: float | None = None) -> tuple[float, float]:
    """The webhook's task: free the call's slot; the call's (start, end).

    Retried when flow control can't be reached. A release is idempotent, so a retry after a
    release that did land (only its answer was lost) is harmless."""
    ended_at = ended_at or time.time()  # before the release: the next call may start the instant it lands
    try:
        release_slot(slot_id)
    except FlowControlError as exc:
        raise self.retry(kwargs={"ended_at": ended_at}, countdown=0.5, exc=exc) from exc
    return placed_at, ended_at


def main(calls: int) -> int:
    with worker(app, concurrency=8):
        placed = [place_call.delay(f"+1555{n:07d}") for n in range(calls)]
        calls_placed = [r.get(timeout=120) for r in placed]
        ended = [app.AsyncResult(webhook).get(timeout=120) for _, webhook in calls_placed]
        # The provider retries a webhook: the second release changes nothing.
        again = release_slot(calls_placed[0][0]).released
    peak = max_in_flight(ended)
    print(
        f"voice_calls: {len(ended)} calls, at most {peak} at once (concurrency {CONCURRENCY}), "
        f"every slot released by the webhook, a second release: released={again}"
    )
    return 0 if len(ended) == calls and peak <= CONCURRENCY and again is False else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 60))
