"""``celery -A proj flowcontrol key QUEUE KEY [--weight W] [--concurrency N] [--rate R]
[--reserve N] [--max-waiting N] | reset``: one tenant's own settings, at run time.

Like ``capacity`` and ``rate``: the override lives in the admission backend and wins over the
queue's ``keys=`` and per-key defaults, fleet-wide, until ``reset`` (``tenants.set_key`` and
``reset_key``). Values are checked as ``keys=`` in config is: a bad one exits 1 with one line
naming the queue, the key and the field. Without options it shows the key's row, changing
nothing.
"""

from __future__ import annotations

from typing import Any

import click

from ..config import as_tuple
from ..errors import FlowControlConfigError
from ..views.queues import limit_text
from ..views.tenant_rows import KeyRow, key_rows, reset_key, set_key_text
from .commands import flow_control, flowcontrol, json_option, one_line_errors
from .render import table, to_json


def key_table(rows: list[KeyRow]) -> str:
    """The tenants as ``keys`` prints them (``key`` prints one)."""
    return table(["KEY", "BUSY", "WAITING", "WEIGHT", "CONCURRENCY", "RATE", "RESERVE",
                  "MAX WAITING", "SHARE 1m", "PAUSED"],
                 [[r.key + ("*" if r.overridden else ""), r.busy, r.waiting, f"{r.weight:g}",
                   r.concurrency, r.rate_limit, r.reserve, r.max_waiting,
                   f"{r.share * 100:.0f}% ({r.admitted_recent})", r.paused] for r in rows])


#: How many of a queue's busiest keys ``key`` looks through for the key's row.
LOOKED_AT = 1000


def _shown(fc: Any, name: str, key: str) -> KeyRow | None:
    return next((r for r in key_rows(fc, name, LOOKED_AT) if r.key == key), None)


def settings_text(config: Any) -> str:
    """A key's settings in force, as ``set_key`` returns them."""
    rates = ", ".join(limit_text(r) for r in as_tuple(config.rate_limit)) or "-"
    return (f"weight {config.weight:g}, concurrency {_or_dash(config.concurrency)}, rate {rates}, "
            f"reserve {_or_dash(config.reserve)}, max waiting {_or_dash(config.max_waiting)}")


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


@flowcontrol.command()
@click.argument("name")
@click.argument("key")
@click.argument("action", required=False, metavar="[reset]")
@click.option("--weight", type=float, default=None, help="Its share while keys wait (> 0).")
@click.option("--concurrency", type=int, default=None, help="The most slots it holds at once.")
@click.option("--rate", "rate_limit", default=None, metavar="LIMIT",
              help='Its own rate limits: "60/m", several ("60/m 1000/d"), or JSON.')
@click.option("--reserve", type=int, default=None, help="Slots it is served first for.")
@click.option("--max-waiting", "max_waiting", type=int, default=None,
              help="The most of its calls that may wait; more are refused.")
@json_option
@click.pass_context
@one_line_errors
def key(ctx: click.Context, name: str, key: str, action: str | None, weight: float | None,
        concurrency: int | None, rate_limit: str | None, reserve: int | None,
        max_waiting: int | None, as_json: bool) -> None:
    """Override fairness key KEY of queue NAME (weight, caps, reserve, max waiting), or
    `reset` it to config; without options, show it."""
    fc = flow_control(ctx)
    values = {"weight": weight, "concurrency": concurrency, "rate_limit": rate_limit,
              "reserve": reserve, "max_waiting": max_waiting}
    changes = {f: v for f, v in values.items() if v is not None}
    if action is not None:
        if action.strip().lower() != "reset" or changes:
            raise FlowControlConfigError(
                f"key {key!r}: give options to set (--weight, --concurrency, --rate, "
                f"--reserve, --max-waiting) or `reset` alone, got {action!r}", name, "keys")
        reset_key(fc, name, key)
        what = "reset to config"
    elif changes:
        config = set_key_text(fc, name, key, changes)
        what = "overridden: " + ", ".join(sorted(changes)) + "; now " + settings_text(config)
    else:
        fc.backend.get_config(name)  # an unknown queue is named
        what = None
    row = _shown(fc, name, key)
    if as_json:
        click.echo(to_json({"queue": name, "key": key, "changed": what,
                            "row": row.to_dict() if row else None}))
        return
    if what is not None:
        click.echo(f"{name}: key {key} {what}")
    if row is None:
        click.echo(f"{name}: key {key} is not among the {LOOKED_AT} busiest keys (nothing busy "
                   "or waiting)")
    else:
        click.echo(key_table([row]))
