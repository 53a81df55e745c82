"""``celery -A proj flowcontrol dead``: the dead-letter table, newest first, and the way back.

A message lands there when it could never succeed by trying again as things stood: the parking
database refused it (``park-rejected``), its wake could not be published (``wake-failed``), or
its cost is above every limit. ``dead requeue ID... | --queue Q | --all [--yes]`` parks letters
anew, due now, once the cause is fixed; a worker's next poll publishes them. Kept in its own
module (the verb is registered on the ``flowcontrol`` group from ``cli/__init__.py``) so that
it stays apart from the verbs of :mod:`.commands`.
"""

from __future__ import annotations

import click

from ..views.dead import dead_count, dead_rows, requeue
from ..views.text import when
from .commands import Refusal, flow_control, flowcontrol, json_option, one_line_errors
from .render import table, to_json


@flowcontrol.group(invoke_without_command=True)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000),
              help="Most dead letters to show (newest first).")
@click.option("--queue", default=None, help="Only the dead letters of this flow queue.")
@json_option
@click.pass_context
@one_line_errors
def dead(ctx: click.Context, limit: int, queue: str | None, as_json: bool) -> None:
    """Messages that could not be parked or woken (dead letters), newest first, with the
    reason; `dead requeue` brings them back."""
    if ctx.invoked_subcommand is not None:
        return
    rows = [r.to_dict() for r in dead_rows(flow_control(ctx), limit, queue)]
    if as_json:
        click.echo(to_json(rows))
        return
    if not rows:
        click.echo("no dead letters")
        return
    click.echo(table(["ID", "TASK", "NAME", "QUEUE", "REASON", "WHEN", "ERROR"],
                     [[r["id"], r["task_id"], r["task_name"], r["queue"], r["reason"],
                       when(r["created_at"]), str(r["error"])[:120]] for r in rows]))


@dead.command(name="requeue")
@click.argument("ids", nargs=-1, type=click.IntRange(min=1))
@click.option("--queue", default=None, help="Every dead letter of this flow queue.")
@click.option("--all", "every", is_flag=True, help="Every dead letter.")
@click.option("--yes", is_flag=True, help="Really requeue them all (--queue, --all).")
@json_option
@click.pass_context
@one_line_errors
def requeue_command(ctx: click.Context, ids: tuple[int, ...], queue: str | None, every: bool,
                    yes: bool, as_json: bool) -> None:
    """Park dead letters ID... (or all of --queue Q, or --all) anew, due now: a worker's next
    poll publishes them. An id that is not a dead letter is an error, and nothing is requeued."""
    if sum((bool(ids), queue is not None, every)) != 1:
        raise click.UsageError("give dead-letter ids, --queue Q, or --all (exactly one of them)")
    fc = flow_control(ctx)
    if not ids and not yes:
        n = dead_count(fc, queue)
        what = f"of queue {queue!r}" if queue is not None else "in the table"
        raise Refusal(f"refusing to requeue {n} dead letter{'s' if n != 1 else ''} {what} "
                      "without --yes")
    done = requeue(fc, ids, queue=queue, every=every)
    if as_json:
        click.echo(to_json([r.to_dict() for r in done]))
    elif not done:
        click.echo("no dead letters to requeue")
    for r in done if not as_json else ():
        click.echo(r.text())
    if any(r.refused is not None for r in done):
        ctx.exit(1)
