"""``celery -A proj flowcontrol collapsed``: held unique keys, latest-wins keys, pending
debounced calls and batches gathering.

Kept in its own module (registered on the ``flowcontrol`` group from ``cli/__init__.py``),
as ``dead`` is.
"""

from __future__ import annotations

import click

from ..views.collapsed import collapsed as collapsed_view
from ..views.collapsed import gathering, latest_keys
from ..views.text import duration, when
from .commands import flow_control, flowcontrol, json_option, one_line_errors
from .render import table, to_json


@flowcontrol.command()
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 10_000),
              help="Most rows of each kind to show.")
@json_option
@click.pass_context
@one_line_errors
def collapsed(ctx: click.Context, limit: int, as_json: bool) -> None:
    """Calls that collapse: unique keys held now, latest-wins keys, debounced calls pending,
    batches gathering."""
    fc = flow_control(ctx)
    unique, pending = collapsed_view(fc, limit)
    latest = latest_keys(fc, limit)
    batches = gathering(fc, limit)
    if as_json:
        click.echo(to_json({"unique": [u.to_dict() for u in unique],
                            "latest": [k.to_dict() for k in latest],
                            "debounce": [d.to_dict() for d in pending],
                            "batch": [b.to_dict() for b in batches]}))
        return
    if unique:
        click.echo(table(["UNIQUE KEY", "HELD BY", "TTL"],
                         [[u.key[:80], u.task_id, duration(u.ttl)] for u in unique]))
    else:
        click.echo("no unique key is held")
    click.echo("")
    if latest:
        click.echo(table(["LATEST KEY", "NEWEST CALL", "RUNNING", "TTL"],
                         [[k.key[:80], k.latest + (" (done)" if k.done else ""),
                           k.running or "-", duration(k.ttl)] for k in latest]))
    else:
        click.echo("no latest-wins key is held")
    click.echo("")
    if pending:
        click.echo(table(["DEBOUNCE KEY", "TASK", "CALLS", "LAST ARGS", "RUNS"],
                         [[d.key[:60], d.task_id, d.calls, d.args[:60], when(d.wake_at)]
                          for d in pending]))
    else:
        click.echo("no debounced call is pending")
    click.echo("")
    if batches:
        click.echo(table(["BATCH KEY", "CALLS", "OLDEST"],
                         [[b.key[:80], b.calls, duration(b.oldest_age)] for b in batches]))
    else:
        click.echo("no batch is gathering")
