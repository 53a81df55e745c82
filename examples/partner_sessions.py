"""Partner API sessions: at most 3 open at once, fleet-wide, held only inside a block.

``sync_account`` opens a session with the partner only inside ``with with_limit("partner")``:
the block takes a slot of the flow queue ``partner`` (concurrency 3) and releases it when the
block ends, even when it raises. When no slot is free, the task is parked (no pool process
waits) and runs again *from the start* once a slot is granted: code before the ``with``
runs again, so keep it idempotent (here: nothing but a log line).

Run ``python examples/partner_sessions.py [ACCOUNTS]`` (default 12).
"""

from __future__ import annotations

import sys
import time

from _run import make_app, max_in_flight, worker

from celery_flowcontrol import FlowTask, with_limit

SESSIONS = 3
app = make_app("partner_sessions", [{"name": "partner", "concurrency": SESSIONS}])


@app.task(base=FlowTask)
def sync_account(account: int) -> tuple[float, float]:
    """Sync one account through a partner session; the session's (start, end)."""
    with with_limit("partner", label=f"account {account}", timeout="1m"):
        start = time.time()
        time.sleep(0.3)  # the partner API calls
        return start, time.time()


def main(accounts: int) -> int:
    with worker(app, concurrency=6):
        results = [sync_account.delay(n) for n in range(accounts)]
        spans = [tuple(r.get(timeout=120)) for r in results]
    peak = max_in_flight(spans)
    print(f"partner_sessions: {len(spans)} accounts synced, at most {peak} sessions at once (limit {SESSIONS})")
    return 0 if len(spans) == accounts and peak <= SESSIONS else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 12))
