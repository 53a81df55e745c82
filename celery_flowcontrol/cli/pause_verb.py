"""``celery -A proj flowcontrol pause QUEUE [--key K] [--for 10m]``: stop admissions.

A paused queue (or key) admits nothing, fleet-wide, until ``resume`` or until ``--for`` has
passed (as ``tenants.pause``); its running tasks finish and its waiters keep their places.
"""

from __future__ import annotations

import click

from ..views.tenant_rows import pause as pause_queue
from ..views.text import when
from .commands import flow_control, flowcontrol, json_option, one_line_errors
from .render import to_json


@flowcontrol.command()
@click.argument("name")
@click.option("--key", default=None, help="Pause only this fairness key.")
@click.option("--for", "for_", default=None, metavar="DURATION",
              help='End the pause by itself after this long ("10m", "2h"); default: at resume.')
@json_option
@click.pass_context
@one_line_errors
def pause(ctx: click.Context, name: str, key: str | None, for_: str | None,
          as_json: bool) -> None:
    """Admit nothing of queue NAME (or of its --key) until `resume` (or --for has passed)."""
    until = pause_queue(flow_control(ctx), name, key, for_)
    if as_json:
        click.echo(to_json({"queue": name, "key": key, "paused_until": until}))
        return
    what = f"{name}: key {key}" if key is not None else name
    click.echo(f"{what} paused " + ("until resumed" if until is None else f"until {when(until)}"))
