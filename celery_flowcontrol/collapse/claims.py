"""Claims on collapse keys: which call holds a unique key, which burst a debounce key is in.

Features
    ``claim(kind, collapse_key, task_id, ttl)`` gives the key to *task_id* if it is free (or already
    its own, whose TTL then starts again) and returns whoever holds it afterwards, in one
    atomic step; ``release`` frees it only for its holder, ``extend`` sets its holder's TTL.
    Every claim has a TTL, so a holder that crashed can't keep a key for good.
    ``held(kind)`` lists the keys held now (for the CLI and the dashboard). ``join(kind,
    task_id, ttl)`` counts the calls that joined a holder (a batch: it is full at its size).

Connection
    :class:`MemoryClaims`: one process (the ``memory://`` admission backend's scope).
    :class:`RedisClaims`: a redis-py client (the Redis admission backend's), exact across
    every process that uses the same key prefix. Redis keys are ``<prefix>:<kind>:<collapse key>``; each
    operation is one Lua script over that one redis key (``collapse/lua/unique_*.lua``), so
    it holds on Redis Cluster too.

Options
    ``clock`` (``time.time``, memory only): the TTL's clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..lua_loader import compose

__all__ = ["KINDS", "Claims", "Held", "MemoryClaims", "RedisClaims", "scan_names"]

#: ``unique``: the first call of a key; ``debounce``: the pending burst of a debounce key.
KINDS = ("unique", "debounce")


@dataclass(frozen=True, slots=True)
class Held:
    """One claimed collapse key: its kind, the key, the task id holding it and the seconds it has left."""

    kind: str
    collapse_key: str
    task_id: str
    ttl: float | None


class Claims:
    """The operations every claim store has (see the module docstring)."""

    def claim(self, kind: str, collapse_key: str, task_id: str, ttl: float) -> str:
        """Claim *collapse_key* for *task_id* for *ttl* seconds; the task id holding it afterwards."""
        raise NotImplementedError

    def release(self, kind: str, collapse_key: str, task_id: str) -> bool:
        """Free *collapse_key* if *task_id* holds it; whether it did."""
        raise NotImplementedError

    def extend(self, kind: str, collapse_key: str, task_id: str, ttl: float) -> bool:
        """Give *collapse_key* *ttl* seconds from now if *task_id* holds it; whether it does."""
        raise NotImplementedError

    def holder(self, kind: str, collapse_key: str) -> str | None:
        """The task id holding *collapse_key*, or ``None``."""
        raise NotImplementedError

    def held(self, kind: str, limit: int = 1000) -> list[Held]:
        """Up to *limit* keys of *kind* held now, by key."""
        raise NotImplementedError

    def join(self, kind: str, task_id: str, ttl: float, n: int = 1) -> int:
        """Count *n* more calls joining *task_id* (a batch) for *ttl* seconds; how many have."""
        raise NotImplementedError


class MemoryClaims(Claims):
    """Claims of one process (thread-safe)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._keys: dict[tuple[str, str], tuple[str, float]] = {}
        self._joined: dict[tuple[str, str], tuple[int, float]] = {}  # -> (calls, until)

    def _live(self, kind: str, collapse_key: str, now: float) -> str | None:
        entry = self._keys.get((kind, collapse_key))
        if entry is None:
            return None
        if entry[1] <= now:
            del self._keys[(kind, collapse_key)]
            return None
        return entry[0]

    def claim(self, kind: str, collapse_key: str, task_id: str, ttl: float) -> str:
        with self._lock:
            now = self.clock()
            holder = self._live(kind, collapse_key, now)
            if holder is not None and holder != task_id:
                return holder
            self._keys[(kind, collapse_key)] = (task_id, now + ttl)
            return task_id

    def release(self, kind: str, collapse_key: str, task_id: str) -> bool:
        with self._lock:
            if self._live(kind, collapse_key, self.clock()) != task_id:
                return False
            del self._keys[(kind, collapse_key)]
            return True

    def extend(self, kind: str, collapse_key: str, task_id: str, ttl: float) -> bool:
        with self._lock:
            now = self.clock()
            if self._live(kind, collapse_key, now) != task_id:
                return False
            self._keys[(kind, collapse_key)] = (task_id, now + ttl)
            return True

    def holder(self, kind: str, collapse_key: str) -> str | None:
        with self._lock:
            return self._live(kind, collapse_key, self.clock())

    def held(self, kind: str, limit: int = 1000) -> list[Held]:
        with self._lock:
            now = self.clock()
            live = [(k, v) for k, v in self._keys.items() if k[0] == kind and v[1] > now]
        return [Held(kind, k[1], v[0], v[1] - now) for k, v in sorted(live)[:limit]]

    def join(self, kind: str, task_id: str, ttl: float, n: int = 1) -> int:
        with self._lock:
            now = self.clock()
            for k in [k for k, (_, until) in self._joined.items() if until <= now]:
                del self._joined[k]
            total = self._joined.get((kind, task_id), (0, 0.0))[0] + n
            self._joined[(kind, task_id)] = (total, now + ttl)
            return total


def _lua(name: str) -> str:
    return compose(__package__, name)  # collapse/lua/<name>.lua, whole: no module, no constant


class RedisClaims(Claims):
    """Claims in Redis, shared by every process with the same *key_prefix*."""

    def __init__(self, client: Any, key_prefix: str = "fc") -> None:
        self.client = client
        self.key_prefix = key_prefix
        self._claim_script = client.register_script(_lua("unique_claim"))
        self._release_script = client.register_script(_lua("unique_release"))
        self._extend_script = client.register_script(_lua("unique_extend"))

    def redis_key(self, kind: str, collapse_key: str) -> str:
        """The one redis key builder: ``<prefix>:<kind>:<collapse_key>``."""
        return f"{self.key_prefix}:{kind}:{collapse_key}"

    def claim(self, kind: str, collapse_key: str, task_id: str, ttl: float) -> str:
        holder = self._claim_script(keys=[self.redis_key(kind, collapse_key)],
                                    args=[task_id, _ms(ttl)])
        return holder.decode() if isinstance(holder, bytes) else str(holder)

    def release(self, kind: str, collapse_key: str, task_id: str) -> bool:
        return bool(self._release_script(keys=[self.redis_key(kind, collapse_key)], args=[task_id]))

    def extend(self, kind: str, collapse_key: str, task_id: str, ttl: float) -> bool:
        return bool(self._extend_script(keys=[self.redis_key(kind, collapse_key)], args=[task_id, _ms(ttl)]))

    def holder(self, kind: str, collapse_key: str) -> str | None:
        value = self.client.get(self.redis_key(kind, collapse_key))
        return value.decode() if isinstance(value, bytes) else value

    def held(self, kind: str, limit: int = 1000) -> list[Held]:
        head = self.redis_key(kind, "")
        out = []
        for name in scan_names(self.client, head, limit):
            text = name.decode() if isinstance(name, bytes) else name
            pipe = self.client.pipeline(transaction=False)
            pipe.get(name)
            pipe.pttl(name)
            value, pttl = pipe.execute()
            if value is None:
                continue  # freed since the scan
            out.append(Held(kind, text[len(head):], value.decode() if isinstance(value, bytes)
                            else value, pttl / 1000.0 if pttl and pttl > 0 else None))
        return out


    def join(self, kind: str, task_id: str, ttl: float, n: int = 1) -> int:
        # One key per batch id, so each call is one INCR over one key (Cluster-safe).
        pipe = self.client.pipeline(transaction=True)
        name = f"{self.key_prefix}:{kind}-joined:{task_id}"
        pipe.incrby(name, n)
        pipe.pexpire(name, _ms(ttl))
        return int(pipe.execute()[0])


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def scan_names(client: Any, head: str, limit: int) -> list[Any]:
    """Up to *limit* redis keys starting with *head*, sorted: an operator's read of the keys
    held now. SCAN, not KEYS: a large keyspace is read in steps without blocking Redis; it stops
    after ``4 x limit`` names (the first *limit* of a sample, not of the whole keyspace)."""
    names: list[Any] = []
    for name in client.scan_iter(match=_glob_escape(head) + "*", count=500):
        names.append(name)
        if len(names) >= limit * 4:
            break
    return sorted(names)[:limit]


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
