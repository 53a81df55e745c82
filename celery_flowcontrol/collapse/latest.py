"""The newest call of each latest-wins key (``flow_unique_keep="latest"``), and its run lease.

Features
    Per key: the newest call (``claim`` makes a call the newest and says which call it
    replaces and which call runs now), whether that call's run ended (then a later call
    replaces nothing), and the run lease: ``start`` gives it to a call only while the call
    is the newest and no other run holds it, so two runs of a key never overlap; ``extend``
    renews it while the run lasts (a killed node's lapses, as a unique key's does);
    ``finish`` frees it and says whether a newer call came meanwhile (the run's result is
    then discarded). Every step is atomic; ``held`` lists the keys (CLI, dashboard).

Connection
    :class:`MemoryLatest`: one process (the ``memory://`` admission backend's scope).
    :class:`RedisLatest`: a redis-py client, exact across every process of one key prefix.
    Each key is one Redis hash, ``<prefix>:latest:<key>``, and each operation one Lua script
    over it (``collapse/lua/latest_*.lua``), timed by Redis's clock; one key per script, so
    it holds on Redis Cluster too.

Options
    ``clock`` (``time.time``, memory only): the leases' clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..lua_loader import compose
from .claims import scan_names

__all__ = ["BUSY", "LATEST", "REPLACED", "RUN", "LatestHeld", "LatestKeys", "MemoryLatest",
           "RedisLatest"]

#: ``flow_unique_keep``'s value that makes the newest call of a key win.
LATEST = "latest"
#: What :meth:`LatestKeys.start` answers.
RUN, BUSY, REPLACED = "run", "busy", "replaced"


@dataclass(frozen=True, slots=True)
class LatestHeld:
    """One latest-wins key: its newest call, whether that call's run ended, the call running
    now (``None``: none) and the seconds the key has left."""

    collapse_key: str
    latest: str
    done: bool
    running: str | None
    ttl: float | None


class LatestKeys:
    """The operations of the module docstring."""

    def claim(self, collapse_key: str, task_id: str, ttl: float,
              only_if: str | None = None) -> tuple[str | None, str | None]:
        """Make *task_id* the newest call of *collapse_key* for *ttl* seconds (with
        *only_if*: only if that call is the newest now); ``(replaced call, running call)``,
        each ``None`` when there is none."""
        raise NotImplementedError

    def start(self, collapse_key: str, task_id: str, lease: float,
              ttl: float) -> tuple[str, str | None]:
        """Take the run lease for *task_id* (*lease* seconds): ``(RUN, None)``; ``(BUSY,
        runner)`` while another run holds it; ``(REPLACED, newest)`` if a newer call came.
        A key that lapsed makes *task_id* its newest call for *ttl* seconds."""
        raise NotImplementedError

    def extend(self, collapse_key: str, task_id: str, lease: float) -> bool:
        """Renew *task_id*'s run lease for *lease* seconds; whether it holds it."""
        raise NotImplementedError

    def finish(self, collapse_key: str, task_id: str, ending: bool = True) -> str | None:
        """*task_id*'s run ended (*ending*; else it goes on, as a retry does): its lease is
        freed; the newest call's id if a newer call replaced it, else ``None``."""
        raise NotImplementedError

    def held(self, limit: int = 1000) -> list[LatestHeld]:
        """Up to *limit* keys, by key."""
        raise NotImplementedError


@dataclass(slots=True)
class _Key:
    latest: str
    until: float
    done: bool = False
    run: str | None = None
    run_until: float = 0.0


class MemoryLatest(LatestKeys):
    """Latest-wins keys of one process (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, _Key] = {}

    def _live(self, collapse_key: str, now: float) -> _Key | None:
        entry = self._keys.get(collapse_key)
        if entry is not None and entry.until <= now:
            del self._keys[collapse_key]
            return None
        return entry

    def claim(self, collapse_key: str, task_id: str, ttl: float,
              only_if: str | None = None) -> tuple[str | None, str | None]:
        with self._lock:
            now = self.clock()
            entry = self._live(collapse_key, now)
            if only_if is not None and (entry is None or entry.latest != only_if):
                return None, None
            if entry is None:
                self._keys[collapse_key] = _Key(task_id, now + ttl)
                return None, None
            previous = entry.latest if entry.latest != task_id and not entry.done else None
            runner = entry.run if entry.run is not None and entry.run_until > now else None
            entry.latest, entry.done = task_id, False
            entry.until = now + max(ttl, entry.run_until - now if runner else 0.0)
            return previous, runner

    def start(self, collapse_key: str, task_id: str, lease: float,
              ttl: float) -> tuple[str, str | None]:
        with self._lock:
            now = self.clock()
            entry = self._live(collapse_key, now)
            if entry is None:
                entry = self._keys[collapse_key] = _Key(task_id, now + ttl)
            if entry.latest != task_id:
                return REPLACED, entry.latest
            if entry.run is not None and entry.run != task_id and entry.run_until > now:
                return BUSY, entry.run
            entry.done, entry.run, entry.run_until = False, task_id, now + lease
            entry.until = max(entry.until, now + lease)
            return RUN, None

    def extend(self, collapse_key: str, task_id: str, lease: float) -> bool:
        with self._lock:
            now = self.clock()
            entry = self._live(collapse_key, now)
            if entry is None or entry.run != task_id:
                return False
            entry.run_until = now + lease
            entry.until = max(entry.until, now + lease)
            return True

    def finish(self, collapse_key: str, task_id: str, ending: bool = True) -> str | None:
        with self._lock:
            entry = self._live(collapse_key, self.clock())
            if entry is None:
                return None
            if entry.run == task_id:
                entry.run, entry.run_until = None, 0.0
            if entry.latest != task_id:
                return entry.latest
            entry.done = entry.done or ending
            return None

    def held(self, limit: int = 1000) -> list[LatestHeld]:
        with self._lock:
            now = self.clock()
            live = sorted((k, v) for k, v in self._keys.items() if v.until > now)[:limit]
            return [LatestHeld(k, v.latest, v.done, v.run if v.run_until > now else None,
                               v.until - now) for k, v in live]


class RedisLatest(LatestKeys):
    """Latest-wins keys in Redis, shared by every process with the same *key_prefix*."""

    def __init__(self, client: Any, key_prefix: str = "fc") -> None:
        self.client = client
        self.key_prefix = key_prefix
        # Each script whole, as the collapse claims send theirs (lua_loader.py).
        self._claim_script = client.register_script(compose(__package__, "latest_claim"))
        self._start_script = client.register_script(compose(__package__, "latest_start"))
        self._extend_script = client.register_script(compose(__package__, "latest_extend"))
        self._finish_script = client.register_script(compose(__package__, "latest_finish"))

    def redis_key(self, collapse_key: str) -> str:
        """The one redis key builder: ``<prefix>:latest:<collapse_key>``."""
        return f"{self.key_prefix}:latest:{collapse_key}"

    def claim(self, collapse_key: str, task_id: str, ttl: float,
              only_if: str | None = None) -> tuple[str | None, str | None]:
        previous, runner = self._claim_script(keys=[self.redis_key(collapse_key)],
                                              args=[task_id, _ms(ttl), only_if or ""])
        return _text(previous), _text(runner)

    def start(self, collapse_key: str, task_id: str, lease: float,
              ttl: float) -> tuple[str, str | None]:
        verdict, other = self._start_script(keys=[self.redis_key(collapse_key)],
                                            args=[task_id, _ms(lease), _ms(ttl)])
        return _text(verdict) or RUN, _text(other)

    def extend(self, collapse_key: str, task_id: str, lease: float) -> bool:
        return bool(self._extend_script(keys=[self.redis_key(collapse_key)],
                                        args=[task_id, _ms(lease)]))

    def finish(self, collapse_key: str, task_id: str, ending: bool = True) -> str | None:
        return _text(self._finish_script(keys=[self.redis_key(collapse_key)],
                                         args=[task_id, "1" if ending else "0"]))

    def held(self, limit: int = 1000) -> list[LatestHeld]:
        head = self.redis_key("")
        out = []
        for name in scan_names(self.client, head, limit):
            pipe = self.client.pipeline(transaction=False)
            pipe.hmget(name, "latest", "done", "run", "run_until")
            pipe.pttl(name)
            pipe.time()
            (latest, done, run, run_until), pttl, (secs, micros) = pipe.execute()
            if latest is None:
                continue  # lapsed since the scan
            now_ms = secs * 1000 + micros // 1000
            live = run is not None and float(run_until or 0) > now_ms
            text = name.decode() if isinstance(name, bytes) else name
            out.append(LatestHeld(text[len(head):], str(_text(latest)), _text(done) == "1",
                                  _text(run) if live else None,
                                  pttl / 1000.0 if pttl and pttl > 0 else None))
        return out


def _text(value: Any) -> str | None:
    if value is None or value in (b"", ""):
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))

