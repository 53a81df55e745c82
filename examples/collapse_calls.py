"""Calls that collapse: ``flow_unique`` (one call of a key at a time) and ``flow_debounce`` (a
burst of calls runs once, with the last call's arguments).

A user double-clicks "sync": five calls for account 1 and five for account 2 arrive while the
first of each runs; each account syncs once, and every caller gets that run's result. An
editor saves a document twenty times in a second; it is reindexed once, half a second after
the last save, with the last version. The pending reindex is a parked row, not a timer.

Run ``python examples/collapse_calls.py [SAVES]`` (default 20).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from _run import make_app, worker

from celery_flowcontrol import FlowTask

app = make_app("collapse_calls")
RUNS = Path(os.environ["FLOWCONTROL_EXAMPLE_DIR"]) / "runs.txt"


def ran(what: str) -> None:
    with RUNS.open("a") as f:
        f.write(what + "\n")


@app.task(base=FlowTask, flow_unique=True)
def sync_account(account: int) -> str:
    """Pull one account from the partner API; two syncs of one account at once would race."""
    ran(f"sync {account}")
    time.sleep(0.5)
    return f"account {account} synced"


@app.task(base=FlowTask, flow_debounce="0.5s", flow_debounce_max="5s",
          debounce_key=lambda args, kwargs: args[0])
def reindex(doc: str, version: int) -> int:
    """Rebuild a document's search index: only its newest version matters."""
    ran(f"reindex {doc} {version}")
    return version


def main(saves: int) -> int:
    with worker(app, concurrency=4):
        clicks = [sync_account.delay(account) for account in (1, 2) for _ in range(5)]
        edits = []
        for version in range(saves):
            edits.append(reindex.delay("readme", version))
            time.sleep(0.02)
        synced = [r.get(timeout=30) for r in clicks]
        indexed = [r.get(timeout=30) for r in edits]
    runs = RUNS.read_text().splitlines()
    syncs = sum(line.startswith("sync") for line in runs)
    reindexes = [line for line in runs if line.startswith("reindex")]
    resolved = synced == [f"account {a} synced" for a in (1, 2) for _ in range(5)] and \
        indexed == [saves - 1] * saves
    print(f"collapse_calls: {len(clicks)} sync calls ran {syncs} times, {saves} saves reindexed "
          f"{len(reindexes)} time(s) with version {indexed[-1]}, every result resolved: {resolved}")
    return 0 if syncs == 2 and len(reindexes) == 1 and resolved else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
