"""Resource gauges read from ``/proc`` and the cgroup filesystem, without psutil.

* :func:`memory_percent`: memory in use as a percentage of the tightest limit: the cgroup's
  (v2 ``memory.max``/``memory.current``, v1 ``memory.limit_in_bytes``/``memory.usage_in_bytes``,
  page cache that the kernel can reclaim left out) or the host's (``MemTotal - MemAvailable``).
  A container sees the host's RAM in ``/proc/meminfo``; only its cgroup says when it gets killed.
* :func:`rss_bytes`: resident memory of a set of processes (the worker and its pool children).
* :class:`CpuGauge`: host CPU busy percentage since the previous read, from ``/proc/stat``.

Every path is relative to ``root`` so tests point the gauges at a fake tree. On systems without
``/proc`` (macOS) the gauges return None and the controller simply has no brake for them.
"""

from __future__ import annotations

import os

__all__ = ["CpuGauge", "cgroup_memory", "host_memory", "memory_percent", "rss_bytes"]

_NO_LIMIT = 1 << 60  # cgroup v1 reports "unlimited" as a huge page-aligned number


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _stat_value(text: str | None, key: str) -> int:
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _meminfo(text: str, key: str) -> int | None:
    """Bytes of ``key`` in ``/proc/meminfo``'s text (given there in kB), or None if absent.
    Found, not parsed line by line: the autoscaler reads RAM ten times a second, and the file
    has some 50 lines of which two count."""
    tag = key + ":"
    if text.startswith(tag):
        at = len(tag)
    else:
        found = text.find("\n" + tag)
        if found < 0:
            return None
        at = found + 1 + len(tag)
    end = text.find("\n", at)
    parts = text[at : end if end >= 0 else len(text)].split()
    return int(parts[0]) * 1024 if parts else None


def host_memory(root: str = "/") -> tuple[int, int] | None:
    """Return ``(total, used)`` bytes of the host from ``/proc/meminfo``, or None."""
    text = _read(os.path.join(root, "proc/meminfo"))
    if not text:
        return None
    total, available = _meminfo(text, "MemTotal"), _meminfo(text, "MemAvailable")
    if available is None:
        available = _meminfo(text, "MemFree")
    if not total or available is None:
        return None
    return total, total - available


def cgroup_memory(root: str = "/") -> tuple[int, int] | None:
    """Return ``(limit, used)`` bytes of this process's memory cgroup, or None when unlimited."""
    v2 = os.path.join(root, "sys/fs/cgroup/")
    limit_text = _read(v2 + "memory.max")
    if limit_text is not None:
        if limit_text.strip() == "max":
            return None
        current = int(_read(v2 + "memory.current") or 0)
        # Reclaimable page cache is not what gets a container OOM-killed.
        used = current - _stat_value(_read(v2 + "memory.stat"), "inactive_file")
        return int(limit_text), max(used, 0)
    v1 = v2 + "memory/"
    limit_text = _read(v1 + "memory.limit_in_bytes")
    if limit_text is None or int(limit_text) >= _NO_LIMIT:
        return None
    usage = int(_read(v1 + "memory.usage_in_bytes") or 0)
    used = usage - _stat_value(_read(v1 + "memory.stat"), "total_inactive_file")
    return int(limit_text), max(used, 0)


def memory_percent(root: str = "/") -> float | None:
    """Memory in use as a percentage of the tightest of the cgroup and host limits, or None."""
    figures = [f for f in (cgroup_memory(root), host_memory(root)) if f is not None and f[0] > 0]
    if not figures:
        return None
    return max(100.0 * used / limit for limit, used in figures)


def rss_bytes(pids: list[int], root: str = "/") -> int:
    """Sum of resident set sizes of ``pids`` (processes that vanished count as 0)."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    total = 0
    for pid in pids:
        text = _read(os.path.join(root, f"proc/{pid}/statm"))
        if text:
            total += int(text.split()[1]) * page
    return total


class CpuGauge:
    """Host CPU busy percentage (all cores) between successive :meth:`read` calls."""

    def __init__(self, root: str = "/") -> None:
        self.path = os.path.join(root, "proc/stat")
        self._last = self._times()

    def _times(self) -> tuple[int, int] | None:
        text = _read(self.path)
        if not text:
            return None
        values = [int(v) for v in text.splitlines()[0].split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return sum(values), idle

    def read(self) -> float | None:
        """Percent of CPU time busy since the previous call, or None when unknown."""
        now, last = self._times(), self._last
        self._last = now
        if now is None or last is None or now[0] <= last[0]:
            return None
        total, idle = now[0] - last[0], now[1] - last[1]
        return 100.0 * (total - idle) / total
