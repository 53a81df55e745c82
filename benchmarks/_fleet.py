"""Shared pieces of the worker benchmarks: a throwaway fleet, RSS readings and the result table.

The fleets are the e2e harness's (:class:`tests.support.harness.Harness`): real ``celery worker``
subprocesses on the Redis broker at ``FLOWCONTROL_TEST_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``), with the tasks measuring themselves through the Redis gauge.
Run from the repository root (``python -m benchmarks.contended``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.harness import Harness

REDIS_URL = os.environ.get("FLOWCONTROL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@contextmanager
def fleet(conf: dict[str, Any] | None = None, *, flow: bool = True, keep: bool = False,
          kind: type[Harness] = Harness) -> Iterator[Harness]:
    """A harness (of class *kind*) in a temp dir with its own prefix, SQLite parking and the
    Redis backend."""
    workdir = Path(tempfile.mkdtemp(prefix="fc-bench-"))
    prefix = f"fcb-{uuid.uuid4().hex[:8]}"
    settings: dict[str, Any] = {
        "flowcontrol_backend_url": REDIS_URL,
        "flowcontrol_parking_url": f"sqlite:///{workdir / 'park.sqlite3'}",
        "flowcontrol_poll_interval": 0.2,
    }
    settings.update(conf or {})
    harness = kind(workdir=workdir / "proj", broker_url=REDIS_URL, gauge_url=REDIS_URL, prefix=prefix,
                      conf=settings, flow=flow)  # fmt: skip
    try:
        yield harness
    except BaseException:
        print(harness.logs(3000))
        raise
    finally:
        harness.close()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


def rss_kb(pid: int) -> int:
    """Resident set size of one process in KiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    """The direct children of a process (the prefork pool of a worker)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass
class Row:
    """One figure beside its baseline: ``ok`` is judged by the caller against ``target``."""

    figure: str
    measured: float
    baseline: float | None
    unit: str
    ratio: float | None
    target: str
    ok: bool


def table(title: str, rows: list[Row]) -> str:
    """A plain-text table of figures, baselines, ratios and targets."""
    head = f"{'figure':44} {'measured':>12} {'baseline':>12} {'ratio':>7}  {'target':24} ok"
    lines = [title, head, "-" * len(head)]
    for r in rows:
        base = f"{r.baseline:.2f} {r.unit}" if r.baseline is not None else "-"
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        lines.append(f"{r.figure:44} {f'{r.measured:.2f} {r.unit}':>12} {base:>12} {ratio:>7}  {r.target:24} "
                     f"{'yes' if r.ok else 'NO'}")  # fmt: skip
    return "\n".join(lines)


def parser(description: str | None) -> argparse.ArgumentParser:
    """The common command line: ``--quick`` (a smaller run) and ``--full``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a smaller run (fewer tasks)")
    return p
