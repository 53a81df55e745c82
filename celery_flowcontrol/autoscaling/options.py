"""``flowcontrol_autoscale``: the autoscaler's settings, validated once with clear errors.

Every key is optional; anything unknown or out of range raises
:class:`~celery_flowcontrol.errors.FlowControlConfigError` naming the key, e.g.
``field 'flowcontrol_autoscale.tick': must be a duration: ...``.

``min``/``max`` default to the worker's ``--autoscale=max,min``; when given here they win.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..config import parse_duration, unknown_key_detail
from ..errors import FlowControlConfigError

__all__ = ["AutoscaleOptions", "import_object"]

SETTING = "flowcontrol_autoscale"


def _fail(key: str, detail: str) -> FlowControlConfigError:
    return FlowControlConfigError(detail, None, f"{SETTING}.{key}")


def import_object(path: str, key: str) -> Any:
    """Import ``"package.module:attr"`` (or ``package.module.attr``); errors name the setting key."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise _fail(key, f"cannot import {path!r}: {exc}") from exc


@dataclass(frozen=True)
class AutoscaleOptions:
    """The autoscaler's settings; see ``docs/autoscale.md`` for each one with its default."""

    min: int | None = None
    max: int | None = None
    start: int | None = None
    tick: float = 2.0
    ram_ceiling_pct: float | None = 85.0
    cpu_ceiling_pct: float | None = None
    tolerance: float = 1.15
    shrink_tolerance: float = 1.25
    baseline_window: int = 30
    stall_after: float | None = None
    drop_exceptions: tuple[str, ...] = ()
    ram_gauge: Callable[[], float] | None = None
    cpu_gauge: Callable[[], float] | None = None

    @classmethod
    def from_value(cls, value: object, cli_min: int | None = None, cli_max: int | None = None) -> AutoscaleOptions:
        """Validate ``value`` (None or a dict) and resolve min/max against the ``--autoscale`` bounds."""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise FlowControlConfigError(f"must be a dict such as {{'max': 16}}, got {value!r}", None, SETTING)
        names = [f.name for f in fields(cls)]
        for key in value:
            if key not in names:
                raise FlowControlConfigError(unknown_key_detail(key, names), None, SETTING)
        raw = dict(value)
        hi = _int(raw.get("max", cli_max if cli_max else 32), "max", 1)
        lo = _int(raw.get("min", cli_min if cli_min else 1), "min", 1)
        if lo > hi:
            raise _fail("min", f"must be <= max ({hi}), got {lo}")
        start = raw.get("start")
        if start is not None:
            start = _int(start, "start", lo)
            if start > hi:
                raise _fail("start", f"must be between min ({lo}) and max ({hi}), got {start}")
        tolerance = _number(raw.get("tolerance", 1.15), "tolerance", 1.0, 3.0)
        shrink = _number(raw.get("shrink_tolerance", max(1.25, tolerance)), "shrink_tolerance", tolerance, 5.0)
        drops = raw.get("drop_exceptions", ())
        if isinstance(drops, str) or not all(isinstance(d, str) for d in drops):
            raise _fail("drop_exceptions", f"must be a list of exception names, got {drops!r}")
        stall = raw.get("stall_after")
        return cls(
            min=lo,
            max=hi,
            start=start,
            tick=parse_duration(raw.get("tick", 2.0), field=f"{SETTING}.tick"),
            ram_ceiling_pct=_pct(raw.get("ram_ceiling_pct", 85.0), "ram_ceiling_pct"),
            cpu_ceiling_pct=_pct(raw.get("cpu_ceiling_pct"), "cpu_ceiling_pct"),
            tolerance=tolerance,
            shrink_tolerance=shrink,
            baseline_window=_int(raw.get("baseline_window", 30), "baseline_window", 3),
            stall_after=None if stall is None else parse_duration(stall, field=f"{SETTING}.stall_after"),
            drop_exceptions=tuple(drops),
            ram_gauge=_gauge(raw.get("ram_gauge"), "ram_gauge"),
            cpu_gauge=_gauge(raw.get("cpu_gauge"), "cpu_gauge"),
        )


def _int(value: object, key: str, low: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= 100_000:
        return value
    raise _fail(key, f"must be an int between {low} and 100000, got {value!r}")


def _number(value: object, key: str, low: float, high: float) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        if low <= value <= high:
            return float(value)
    raise _fail(key, f"must be a number between {low:g} and {high:g}, got {value!r}")


def _pct(value: object, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 100:
        return float(value)
    raise _fail(key, f"must be a percentage above 0 and at most 100, or None, got {value!r}")


def _gauge(value: object, key: str) -> Callable[[], float] | None:
    if value is None:
        return None
    gauge = import_object(value, key) if isinstance(value, str) else value
    if not callable(gauge):
        raise _fail(key, f"must be a zero-argument callable or its dotted path, got {value!r}")
    return gauge
