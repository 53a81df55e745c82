"""``celery -A proj flowcontrol why TASK_ID [--json]``: why a task has not started.

Prints ``explain``'s one sentence (``text``); ``--json`` prints the whole dict. An id nobody
has seen says ``unseen`` (it may still be in the broker): never an error. Kept in its own
module (registered on the group from ``cli/__init__.py``), apart from the verbs of
:mod:`.commands`.
"""

from __future__ import annotations

import click

from ..views.explain import explain_task
from .commands import flow_control, flowcontrol, json_option, one_line_errors
from .render import to_json


@flowcontrol.command()
@click.argument("task_id")
@click.option("--timeout", default=1.0, show_default=True, type=click.FloatRange(0),
              help="Seconds the workers may take to answer, when only they can tell.")
@json_option
@click.pass_context
@one_line_errors
def why(ctx: click.Context, task_id: str, timeout: float, as_json: bool) -> None:
    """Why task TASK_ID waits: where it is, what holds it, its place in line."""
    out = explain_task(flow_control(ctx), task_id, timeout=timeout)
    click.echo(to_json(out) if as_json else out["text"])
