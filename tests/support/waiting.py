"""Waiting on what a test waits for: a condition polled to a bound, never a fixed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``check`` until it returns True or ``timeout`` seconds pass; return the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def wait_for(check: Callable[[], bool], timeout: float, interval: float = 0.05, what: str = "") -> None:
    """Poll ``check`` until true; AssertionError naming ``what`` after ``timeout`` seconds."""
    if not wait_until(check, timeout, interval):
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what or check}")


def inside_one_minute(margin: float = 5.0) -> None:
    """Return once the wall-clock minute has more than *margin* seconds left. A fixed rate
    window of a minute starts on each minute (Redis TIME, this machine's clock): a test that
    reads one twice, or admits twice and expects the second denied, must not straddle a turn."""
    while time.time() % 60 > 60 - margin:
        time.sleep(0.2)


def spin(hub: Any, until: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Run a kombu event loop (*hub*, a worker consumer's) until *until()* holds or *timeout*
    seconds pass; the last answer. Whatever a callback of the loop raises comes out here, as
    it would stop a worker's consumer."""
    loop = hub.create_loop()
    deadline = time.monotonic() + timeout
    while not until():
        if time.monotonic() > deadline:
            return False
        next(loop)
    return True
