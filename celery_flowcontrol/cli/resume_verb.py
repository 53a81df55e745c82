"""``celery -A proj flowcontrol resume QUEUE [--key K]``: end a pause (as ``tenants.resume``)."""

from __future__ import annotations

import click

from ..views.tenant_rows import resume as resume_queue
from .commands import flow_control, flowcontrol, json_option, one_line_errors
from .render import to_json


@flowcontrol.command()
@click.argument("name")
@click.option("--key", default=None, help="Resume only this fairness key.")
@json_option
@click.pass_context
@one_line_errors
def resume(ctx: click.Context, name: str, key: str | None, as_json: bool) -> None:
    """Admit queue NAME's (or its --key's) waiters again, in order."""
    resume_queue(flow_control(ctx), name, key)
    if as_json:
        click.echo(to_json({"queue": name, "key": key, "resumed": True}))
        return
    click.echo((f"{name}: key {key}" if key is not None else name) + " resumed")
