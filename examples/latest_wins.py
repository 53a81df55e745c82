"""The latest call wins: ``flow_unique_keep="latest"`` beside ``flow_unique``.

An editor saves a document while its search index is being rebuilt. Once a newer version
exists, rebuilding an older one is wasted work: the running rebuild is stopped, the waiting
ones never start, and only the newest version is indexed. Every caller's result says what
happened to its call: the newest returns its version, the others end ``REVOKED`` naming the
call that replaced them.

The newest call of a key is known fleet-wide through the Redis backend (with ``memory://`` it
holds only inside one process), so this example needs Redis:

    FLOWCONTROL_EXAMPLE_REDIS=redis://127.0.0.1:6379/0 python examples/latest_wins.py [SAVES]

(default 5 saves).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from _run import REDIS, make_app, worker
from celery.exceptions import TaskRevokedError

from celery_flowcontrol import FlowTask

app = make_app("latest_wins")
RUNS = Path(os.environ["FLOWCONTROL_EXAMPLE_DIR"]) / "runs.txt"


def ran(what: str) -> None:
    with RUNS.open("a") as f:
        f.write(what + "\n")


@app.task(base=FlowTask, flow_unique=lambda args, kwargs: args[0], flow_unique_keep="latest")
def reindex(doc: str, version: int) -> int:
    """Rebuild *doc*'s search index from *version* (slow: a second)."""
    ran(f"start {version}")
    time.sleep(1.0)
    ran(f"done {version}")
    return version


def main(saves: int) -> int:
    if not REDIS:
        print("latest_wins needs Redis (the newest call of a key is kept there): run it as\n"
              "  FLOWCONTROL_EXAMPLE_REDIS=redis://127.0.0.1:6379/0 python examples/latest_wins.py",
              file=sys.stderr)
        return 2
    with worker(app, concurrency=2):
        calls = [reindex.delay("readme", 1)]
        deadline = time.monotonic() + 20
        while "start 1" not in (RUNS.read_text() if RUNS.exists() else ""):
            if time.monotonic() > deadline:
                raise RuntimeError("the first rebuild never started")
            time.sleep(0.05)
        calls += [reindex.delay("readme", version) for version in range(2, saves + 1)]
        newest = calls[-1].get(timeout=30)
        replaced = 0
        for call in calls[:-1]:
            try:
                call.get(timeout=30)
            except TaskRevokedError:
                replaced += 1
    runs = RUNS.read_text().splitlines()
    finished = [int(line.split()[1]) for line in runs if line.startswith("done")]
    started = [int(line.split()[1]) for line in runs if line.startswith("start")]
    print(f"latest_wins: {saves} saves, {len(started)} rebuilds started, finished {finished}, "
          f"{replaced} calls replaced (REVOKED), the newest returned version {newest}")
    return 0 if finished == [saves] and newest == saves and replaced == saves - 1 else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
