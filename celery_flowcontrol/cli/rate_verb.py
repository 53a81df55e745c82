"""``celery -A proj flowcontrol rate NAME LIMIT... | reset``: override a queue's rate limits.

Like ``capacity``: the override lives in the admission backend and wins over config,
fleet-wide, until ``reset``. LIMIT takes every form ``rate_limit`` does: ``500/m``, several
(``rate openai 500/m 10000/d``), or JSON for the other fields
(``rate openai '{"limit": 200000, "period": "1m", "per": "cost"}'``). Without LIMIT it shows
the queue's rate limits and their use, changing nothing. Kept in its own module
(registered on the group from ``cli/__init__.py``), apart from the verbs of :mod:`.commands`.
"""

from __future__ import annotations

import click

from ..views import changes
from ..views.queues import queue_row
from ..views.text import when
from .commands import flow_control, flowcontrol, json_option, one_line_errors
from .render import to_json


@flowcontrol.command()
@click.argument("name")
@click.argument("limits", nargs=-1, metavar="[LIMIT...|reset]")
@json_option
@click.pass_context
@one_line_errors
def rate(ctx: click.Context, name: str, limits: tuple[str, ...], as_json: bool) -> None:
    """Show queue NAME's rate limits; with LIMIT, override them ("500/m", several, or JSON),
    or `reset` them to config."""
    if not limits:
        row = queue_row(flow_control(ctx), name, configured=True)
        what = ("operator override" if row.rate_override else "from config") if row.registered \
            else "from config; not yet registered in the backend"
    else:
        row = changes.set_rate_limit(flow_control(ctx), name, " ".join(limits))
        what = "overridden" if row.rate_override else "reset to config"
    if as_json:
        click.echo(to_json(row.to_dict()))
        return
    click.echo(f"{name}: rate limits {row.rates_text() if row.rates else 'none'} ({what})")
    if row.backoff_until is not None:
        click.echo(f"a backoff is in force until {when(row.backoff_until)}")
