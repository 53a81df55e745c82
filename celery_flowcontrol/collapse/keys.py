"""Calls that collapse: what makes two calls "the same", read from a task's options. Pure logic.

A unique call's key is the task name and its arguments, serialised canonically (JSON with
sorted keys, no spaces, ``NaN`` refused; tuples are lists), or the string a key callable
returns for ``(args, kwargs)``. Two calls with one key collapse: the second gets the first
call's task id. A debounce key is made the same way from ``debounce_key`` (default: one key
per task name). Every bad input is a :class:`CollapseError` naming the task and the option,
raised at publish, before anything is sent.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..config.fields import parse_duration
from ..errors import CollapseError, FlowControlConfigError

__all__ = ["CollapseError", "DebounceSpec", "canonical", "debounce_spec", "debounce_key",
           "fit_key", "option_of", "unique_keep", "unique_key", "unique_ttl", "wake_of"]

#: A key longer than this (UTF-8 bytes) is stored as its SHA-256 digest.
MAX_KEY_BYTES = 512
#: ``flow_unique_ttl`` when neither the task nor its flow queue says (``max_hold``).
DEFAULT_UNIQUE_TTL = 3600.0


def option_of(task: Any, name: str) -> Any:
    """A task's option as written: ``@app.task(flow_unique=lambda args, kwargs: ...)`` makes
    the lambda a class attribute, which plain ``getattr`` would bind to the task."""
    value = inspect.getattr_static(task, name, None)
    if isinstance(value, staticmethod):
        return value.__func__
    if isinstance(value, classmethod):
        return getattr(task, name)
    return value


def _plain(value: Any, task: str, option: str, depth: int = 0) -> Any:
    """*value* as JSON's own types, or CollapseError: only what serialises one way counts."""
    if depth > 32:
        raise CollapseError("arguments nest deeper than 32 levels", task, option)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CollapseError(f"argument {value!r} has no canonical JSON form", task, option)
        return value
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                # {1: x} and {"1": x} would serialise alike: two calls made one by accident.
                raise CollapseError(f"mapping key {k!r} is not a str", task, option)
            out[k] = _plain(v, task, option, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, task, option, depth + 1) for v in value]
    raise CollapseError(f"argument of type {type(value).__name__} can't be serialised "
                        "canonically; pass a key callable", task, option)


def canonical(args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None, *, task: str,
              option: str = "flow_unique") -> str:
    """``[args, kwargs]`` as canonical JSON (sorted keys, no spaces), or CollapseError."""
    plain = _plain([list(args or ()), dict(kwargs or {})], task, option)
    return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def called_key(fn: Callable[..., Any], args: Any, kwargs: Any, task: str, option: str) -> str:
    try:
        key = fn(tuple(args or ()), dict(kwargs or {}))
    except Exception as exc:
        raise CollapseError(f"key callable raised {type(exc).__name__}: {exc}", task,
                            option) from exc
    if not isinstance(key, str) or not key:
        raise CollapseError(f"key callable must return a non-empty str, got "
                            f"{type(key).__name__} {key!r:.60}", task, option)
    return key


def fit_key(text: str) -> str:
    """A key as stored: itself, or ``sha256:<hex>`` when over :data:`MAX_KEY_BYTES`."""
    data = text.encode("utf-8", "surrogatepass")
    return text if len(data) <= MAX_KEY_BYTES else "sha256:" + hashlib.sha256(data).hexdigest()


def unique_key(task: str, spec: Any, args: Any, kwargs: Any) -> str | None:
    """The unique key of one call of *task* under ``flow_unique=spec``; ``None``: not unique.

    ``True``: the arguments, canonically; a callable: its string; a str (a header sent by
    ``send_task``): that key as given.
    """
    if spec is None or spec is False:
        return None
    if spec is True:
        return fit_key(f"{task}:{canonical(args, kwargs, task=task)}")
    if isinstance(spec, str) and spec:
        return fit_key(f"{task}:{spec}")
    if callable(spec):
        return fit_key(f"{task}:{called_key(spec, args, kwargs, task, 'flow_unique')}")
    raise CollapseError(f"must be True, a callable (args, kwargs) -> str or a str, got "
                        f"{spec!r:.60}", task, "flow_unique")


#: ``flow_unique_keep``'s values: the first call of a key wins (the default), or the newest.
KEEPS = ("first", "latest")


def unique_keep(task: str, keep: Any, unique: Any, batch: Any = None) -> str:
    """``flow_unique_keep=keep`` of a call whose ``flow_unique`` is *unique* (and
    ``flow_batch`` *batch*): ``"first"`` or ``"latest"``; a value of neither, or one given
    without ``flow_unique`` or with ``flow_batch``, is a CollapseError."""
    if keep is None:
        return "first"
    if keep not in KEEPS:
        raise CollapseError(f"must be 'first' or 'latest', got {keep!r:.60}", task,
                            "flow_unique_keep")
    if batch not in (None, False):
        raise CollapseError("can't be used with flow_batch", task, "flow_unique_keep")
    if unique in (None, False, "", 0):
        raise CollapseError("needs flow_unique (the key whose newest call wins)", task,
                            "flow_unique_keep")
    return str(keep)


def unique_ttl(task: str, value: Any, max_hold: float | None) -> float:
    """Seconds a unique key lives at most: ``flow_unique_ttl``, else the queue's
    ``max_hold``, else :data:`DEFAULT_UNIQUE_TTL`."""
    if value is None:
        return float(max_hold) if max_hold else DEFAULT_UNIQUE_TTL
    return option_duration(value, task, "flow_unique_ttl")


def option_duration(value: Any, task: str, option: str) -> float:
    try:
        return parse_duration(value, field=option)
    except FlowControlConfigError as exc:
        raise CollapseError(exc.detail, task, option) from None


@dataclass(frozen=True, slots=True)
class DebounceSpec:
    """A task's debounce: *seconds* after the last call, at most *max* after the first."""

    seconds: float
    max: float | None


def debounce_spec(task: str, value: Any, max_value: Any = None) -> DebounceSpec | None:
    """The debounce of ``flow_debounce=value, flow_debounce_max=max_value``; ``None``: off."""
    if value is None or value is False:
        return None
    seconds = option_duration(value, task, "flow_debounce")
    top = None if max_value is None else option_duration(max_value, task, "flow_debounce_max")
    if top is not None and top < seconds:
        raise CollapseError(f"must be at least flow_debounce ({seconds:g} s), got {top:g} s",
                            task, "flow_debounce_max")
    return DebounceSpec(seconds, top)


def debounce_key(task: str, spec: Any, args: Any, kwargs: Any) -> str:
    """The burst a call of *task* belongs to: one per task name, or per ``debounce_key``."""
    if spec is None:
        return fit_key(task)
    if isinstance(spec, str) and spec:
        return fit_key(f"{task}:{spec}")
    if not callable(spec):
        raise CollapseError(f"must be a callable (args, kwargs) -> str, got {spec!r:.60}",
                            task, "debounce_key")
    return fit_key(f"{task}:{called_key(spec, args, kwargs, task, 'debounce_key')}")


def wake_of(now: float, first: float, spec: DebounceSpec) -> float:
    """When a burst whose first call came at *first* runs, after a call at *now*: the
    debounce after the last call (trailing edge), but never past ``first + max``."""
    due = now + spec.seconds
    return due if spec.max is None else min(due, first + spec.max)
