"""``celery -A proj flowcontrol keys QUEUE [--limit N] [--json]``: a queue's busiest tenants.

One row per fairness key (``AdmissionBackend.key_stats``, the busiest by busy plus waiting):
busy, waiting, weight, its caps, reserve, max waiting, its share of the last minute's
admissions among the keys shown, and whether it is paused. A ``*`` marks a key with overrides
(``keys=`` or ``flowcontrol key``).
"""

from __future__ import annotations

import click

from ..views.queues import queue_row
from ..views.tenant_rows import key_rows
from ..views.text import when
from .commands import flow_control, flowcontrol, json_option, one_line_errors
from .key_verb import key_table
from .render import to_json


@flowcontrol.command()
@click.argument("name")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000),
              help="Most keys to show, busiest first.")
@json_option
@click.pass_context
@one_line_errors
def keys(ctx: click.Context, name: str, limit: int, as_json: bool) -> None:
    """The busiest fairness keys (tenants) of queue NAME: busy, waiting, weight, caps,
    share of the last minute's admissions, paused."""
    fc = flow_control(ctx)
    row = queue_row(fc, name)
    rows = key_rows(fc, name, limit)
    if as_json:
        click.echo(to_json({"queue": row.to_dict(), "keys": [r.to_dict() for r in rows]}))
        return
    head = f"{name}: {row.in_use} busy, {row.waiting} waiting"
    if row.max_waiting is not None:
        head += f" (at most {row.max_waiting})"
    head += f", {row.refused} refused"
    if row.paused_until is not None:
        head += "; PAUSED " + ("until resumed" if row.paused_until == float("inf")
                               else f"until {when(row.paused_until)}")
    click.echo(head)
    if not rows:
        click.echo("no key has anything busy or waiting")
        return
    click.echo(key_table(rows))
    if any(r.key and r.overridden for r in rows):
        click.echo("* the key has its own settings (keys= in config, or `flowcontrol key`)")
