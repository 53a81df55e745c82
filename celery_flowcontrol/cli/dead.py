"""``celery -A proj flowcontrol dead``: the dead-letter table, newest first.

A message lands there when the parking database refused it for a reason other than an
outage (a value it can't store, a constraint): parking it again could never succeed, so the
worker keeps it here, with the reason and the error, and acks it instead of looping on it.
Kept in its own module (the verb is registered on the ``flowcontrol`` group from
``cli/__init__.py``) so that it stays apart from the verbs of :mod:`.commands`.
"""

from __future__ import annotations

from typing import Any

import click

from ..views.text import when
from .commands import flow_control, flowcontrol, json_option, one_line_errors
from .render import table, to_json


def dead_rows(fc: Any, limit: int) -> list[dict[str, Any]]:
    """The ``limit`` newest dead letters as plain dicts (what ``--json`` prints)."""
    return [{"id": d.id, "task_id": d.task_id, "task_name": d.message.task_name,
             "queue": d.queue, "reason": d.reason, "error": d.error, "created_at": d.created_at}
            for d in fc.store.dead_letters(limit)]


@flowcontrol.command()
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000),
              help="Most dead letters to show (newest first).")
@json_option
@click.pass_context
@one_line_errors
def dead(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Messages that could not be parked (dead letters), newest first, with the reason."""
    rows = dead_rows(flow_control(ctx), limit)
    if as_json:
        click.echo(to_json(rows))
        return
    if not rows:
        click.echo("no dead letters")
        return
    click.echo(table(["ID", "TASK", "NAME", "QUEUE", "REASON", "WHEN", "ERROR"],
                     [[r["id"], r["task_id"], r["task_name"], r["queue"], r["reason"],
                       when(r["created_at"]), str(r["error"])[:120]] for r in rows]))
