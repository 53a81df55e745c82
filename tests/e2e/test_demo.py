"""The README's first command runs the demo: it must pass on a machine with no server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(90)
def test_demo_runs_everything_within_the_cap_and_says_so() -> None:
    """``python examples/demo.py``: exit 0, 200 of 200 run, at most 5 in flight, 40 per 1 s."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    began = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "demo.py")],
        capture_output=True, text=True, timeout=80, env=env, cwd=REPO, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - began
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert re.search(r"tasks run\s+200 of 200\n", out), out[-3000:]
    peak = int(re.search(r"most in flight\s+(\d+)", out).group(1))  # type: ignore[union-attr]
    assert 1 <= peak <= 5, out[-3000:]
    rate = int(re.search(r"peak rate\s+(\d+) admissions", out).group(1))  # type: ignore[union-attr]
    assert rate <= 40, out[-3000:]
    assert re.search(r"parked / woken\s+\d+ times / \d+ times\s+\(0 still parked\)", out), out[-3000:]
    assert "OK: nothing lost, the cap held." in out
    assert elapsed < 60, f"the demo took {elapsed:.0f} s"
