"""Every slot example runs as a user would run it (``python examples/<name>.py``), with the
embedded defaults (filesystem broker, memory:// admission, SQLite parking, a real worker it
starts itself), and prints the summary it promises. One also runs on Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

CASES = {
    "voice_calls": (
        ["22"],
        r"voice_calls: 22 calls, at most (\d+) at once \(concurrency 20\), every slot released by the webhook, "
        r"a second release: released=False",
    ),
    "partner_sessions": (["6"], r"partner_sessions: 6 accounts synced, at most (\d+) sessions at once \(limit 3\)"),
    "report_export": (
        [],
        r"report_export: exported \['monthly.csv', 'yearly.csv'\], daily gave up: True \(flow queue 'exports': "
        r"no slot was granted within 0.5 s\)",
    ),
    "serial_task": (["8"], r"serial_task: 8 steps, at most (1) at once, in order: True"),
    "collapse_calls": (
        ["20"],
        r"collapse_calls: 10 sync calls ran (2) times, 20 saves reindexed 1 time\(s\) with version 19, "
        r"every result resolved: True",
    ),
    "llm_quota": (
        ["16"],
        r"llm_quota: 16 of 16 calls done, (\d+) tokens settled, \d+ pushed back with 429 "
        r"\(each backed off and ran again\)",
    ),
    "fan_out": (
        ["300", "10"],
        r"fan_out: 300 of 300 results in order: True, at most (\d+) in flight \(concurrency 10\)",
    ),
}
CAPS = {"voice_calls": 20, "partner_sessions": 3, "serial_task": 1, "fan_out": 10}


def run_example(name: str, args: list[str], redis_url: str | None = None) -> str:
    """Run one example to its end; its summary line (the last line it prints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWCONTROL_EXAMPLE_")}
    if redis_url:
        env["FLOWCONTROL_EXAMPLE_REDIS"] = redis_url
    done = subprocess.run(  # noqa: S603 - our own interpreter and example
        [sys.executable, str(EXAMPLES / f"{name}.py"), *args],
        cwd=EXAMPLES,
        env=env,
        capture_output=True,
        text=True,
        timeout=55,
        check=False,
    )
    assert done.returncode == 0, f"{name} exited with {done.returncode}:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs_with_embedded_defaults(name: str) -> None:
    args, pattern = CASES[name]
    summary = run_example(name, args)
    match = re.fullmatch(pattern + r".*", summary)
    assert match, f"unexpected summary: {summary!r}"
    if name in CAPS:
        assert 1 <= int(match.group(1)) <= CAPS[name], summary


@pytest.mark.timeout(60)
def test_voice_calls_runs_on_redis(redis_url: str) -> None:
    summary = run_example("voice_calls", ["40"], redis_url)
    match = re.fullmatch(CASES["voice_calls"][1].replace("22", "40"), summary)
    assert match and int(match.group(1)) <= 20, summary


@pytest.mark.timeout(60)
def test_llm_quota_runs_on_redis(redis_url: str) -> None:
    """Costs settled, backoffs recorded and parked calls woken across processes on Redis."""
    summary = run_example("llm_quota", ["16"], redis_url)
    assert re.fullmatch(CASES["llm_quota"][1], summary), summary
