"""``celery -A proj flowcontrol rate NAME LIMIT... | reset``: override a queue's rate limits.

Like ``capacity``: the override lives in the admission backend and wins over config,
fleet-wide, until ``reset``. LIMIT takes every form ``rate_limit`` does: ``500/m``, several
(``rate openai 500/m 10000/d``), or JSON for the other fields
(``rate openai '{"limit": 200000, "period": "1m", "per": "cost"}'``). Kept in its own module
(registered on the group from ``cli/__init__.py``), apart from the verbs of :mod:`.commands`.
"""

from __future__ import annotations

import click

from ..views import changes
from ..views.text import when
from .commands import flow_control, flowcontrol, json_option, one_line_errors
from .render import to_json


@flowcontrol.command()
@click.argument("name")
@click.argument("limits", nargs=-1, required=True, metavar="LIMIT...|reset")
@json_option
@click.pass_context
@one_line_errors
def rate(ctx: click.Context, name: str, limits: tuple[str, ...], as_json: bool) -> None:
    """Override queue NAME's rate limits ("500/m", several, or JSON), or `reset` them to config."""
    row = changes.set_rate_limit(flow_control(ctx), name, " ".join(limits))
    if as_json:
        click.echo(to_json(row.to_dict()))
        return
    what = "overridden" if row.rate_override else "reset to config"
    click.echo(f"{name}: rate limits {row.rates_text()} ({what})")
    if row.backoff_until is not None:
        click.echo(f"a backoff is in force until {when(row.backoff_until)}")
