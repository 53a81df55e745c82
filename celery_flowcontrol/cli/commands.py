"""``celery -A proj flowcontrol ...``: see and steer every flow queue from a shell.

Registered as a Celery subcommand through the ``celery.commands`` entry point, so ``-A proj``
picks the app and the app's ``flowcontrol_*`` settings pick the installation (admission backend,
parking database). Human-readable tables by default; ``--json`` prints one JSON document for
scripts. Every failure (unknown queue or slot, bad value, unreachable service) exits non-zero
with one line on stderr.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar, cast

import click

from ..errors import FlowControlError
from ..settings import DEFAULT_PARKING_URL, FlowControlSettings
from ..views import changes, schema
from ..views.parked import parked_rows
from ..views.queues import QueueRow, queue_names, queue_row, queue_rows
from ..views.slot_rows import slot_rows
from ..views.text import capacity_text, duration, max_hold_text, when
from ..views.waiters import waiter_rows
from ..views.workers import worker_stats
from .render import table, to_json

F = TypeVar("F", bound=Callable[..., Any])

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def _app(ctx: click.Context) -> Any:
    app = getattr(ctx.find_root().obj, "app", None) or getattr(ctx.obj, "app", None)
    if app is None:
        from celery import current_app

        app = current_app
    return app


def _app_named(ctx: click.Context) -> bool:
    """False when ``celery flowcontrol ...`` runs without ``-A``/``--app``: Celery then gives
    its default app, which configures nothing of ours."""
    root = ctx.find_root()
    return root.command.name != "celery" or root.params.get("app") is not None


def flow_control(ctx: click.Context) -> Any:
    """The :class:`~celery_flowcontrol.FlowControl` facade of the command's app (``-A proj``).

    Refused (exit status 2) without ``-A`` when the app configures nothing of ours: Celery's
    default app would read and create ``./flowcontrol.sqlite3`` wherever the shell stands."""
    from ..flowcontrol import FlowControl

    fc = FlowControl(_app(ctx))
    if not _app_named(ctx) and fc.settings == FlowControlSettings():
        raise Refusal(f"no app: name yours with -A, as in `celery -A proj flowcontrol "
                      f"{ctx.info_name}` (proj: the module of your Celery app)")
    return fc


class Refusal(click.ClickException):
    """A command refused for lack of confirmation (exit status 2, like a usage error)."""

    exit_code = 2


def one_line_errors(fn: F) -> F:
    """Turn our errors into ``Error: <one line>`` on stderr and exit status 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FlowControlError as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise click.ClickException(first) from exc

    return cast(F, wrapper)


@click.group(name="flowcontrol")
def flowcontrol() -> None:
    """See and steer flow queues: caps, slots, waiters, parked tasks, workers."""


# -- reading -------------------------------------------------------------------------------------


def _rate(row: QueueRow) -> str:
    text = row.rates_text() + ("*" if row.rate_override else "")
    if row.backoff_until is not None:
        text += f"; backoff until {when(row.backoff_until)}"
    return text


def _paused(row: QueueRow) -> str:
    if row.paused_until is None:
        return "-"
    return "until resumed" if math.isinf(row.paused_until) else f"until {when(row.paused_until)}"


@flowcontrol.command(name="list")
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(0),
              help="Most queues to show, by name (0: all).")
@click.option("--after", default=None, metavar="NAME",
              help="Start after this queue name (the next page).")
@json_option
@click.pass_context
@one_line_errors
def list_(ctx: click.Context, limit: int, after: str | None, as_json: bool) -> None:
    """Every queue: busy/capacity, waiting, parked, rate use, max hold, overrides (*).

    The app's configured queues that no worker has registered yet are listed too, marked
    "(configured)". Paged by name: at most --limit queues, from --after on."""
    fc = flow_control(ctx)
    rows = queue_rows(fc, limit or None, after, configured=True)
    if as_json:
        click.echo(to_json([r.to_dict() for r in rows]))
        return
    if not rows:
        click.echo("no flow queues: flowcontrol_queues configures none, and none is registered "
                   "in this backend")
        return
    # Bounded waiting and pauses get their columns only when a queue listed has them.
    tenants = any(r.paused or r.max_waiting is not None or r.refused for r in rows)
    click.echo(table(
        ["QUEUE", "BUSY/CAP", "GRANTED", "WAITING", "PARKED", "RATE USED", "MAX HOLD", "OVERRIDES",
         *(["REFUSED", "PAUSED"] if tenants else [])],
        [[r.name if r.registered else f"{r.name} (configured)",
          f"{r.in_use}/{capacity_text(r.capacity, r.capacity_override)}", r.granted,
          r.waiting if r.max_waiting is None else f"{r.waiting}/{r.max_waiting}",
          "?" if r.parked is None else r.parked, _rate(r),
          max_hold_text(r.max_hold, r.max_hold_override), ",".join(r.overrides) or "-",
          *([r.refused, _paused(r)] if tenants else [])]
         for r in rows]))
    if tenants:
        click.echo("WAITING n/N: N is the queue's max_waiting; REFUSED: calls refused with "
                   "FlowQueueFull")
    if any(r.overrides for r in rows):
        click.echo("* operator override: wins over config until reset")
    if not all(r.registered for r in rows):
        click.echo("(configured): in flowcontrol_queues, not yet registered in the backend (a "
                   "worker registers it at boot): its limits are its config's, nothing runs")
    if limit and len(rows) == limit and len(queue_names(fc, 1, rows[-1].name, configured=True)):
        click.echo(f"more queues: --after {rows[-1].name}")


@flowcontrol.command()
@click.argument("name")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(0, 10_000),
              help="Most waiters to show.")
@json_option
@click.pass_context
@one_line_errors
def slots(ctx: click.Context, name: str, limit: int, as_json: bool) -> None:
    """Busy slots of queue NAME, then its waiters in the order they will be served."""
    fc = flow_control(ctx)
    row = queue_row(fc, name, configured=True)
    if not row.registered:
        click.echo(f"{name}: configured, not yet registered in the backend (no worker booted): "
                   "no slots, no waiters")
        return
    busy = slot_rows(fc, name)
    waiters = waiter_rows(fc, name, limit)
    if as_json:
        click.echo(to_json({"queue": row.to_dict(), "slots": [s.to_dict() for s in busy],
                            "waiters": [w.to_dict() for w in waiters]}))
        return
    click.echo(f"{name}: {row.in_use}/{capacity_text(row.capacity, row.capacity_override)} busy, "
               f"{row.granted} granted, {row.waiting} waiting")
    click.echo(f"\nbusy slots ({len(busy)}):")
    click.echo(table(["SLOT", "HOLDER", "TASK", "LABEL", "AGE", "EXPIRES IN"],
                     [[s.slot_id, s.holder, s.task_id, s.label or "-", duration(s.age),
                       duration(s.expires_in)] for s in busy]))
    shown = f"first {len(waiters)} of {row.waiting}" if len(waiters) < row.waiting else len(waiters)
    click.echo(f"\nwaiters ({shown}, in the order they will be served):")
    click.echo(table(["#", "TASK", "PRIORITY", "KEY", "LABEL", "WAITING"],
                     [[w.position, w.task_id, w.priority, w.fairness_key or "-", w.label or "-",
                       duration(w.age)] for w in waiters]))


@flowcontrol.command()
@click.argument("name")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
@json_option
@click.pass_context
@one_line_errors
def parked(ctx: click.Context, name: str, limit: int, as_json: bool) -> None:
    """Messages of queue NAME parked in SQL, in wake order."""
    fc = flow_control(ctx)
    rows = parked_rows(fc, name, limit)
    if as_json:
        click.echo(to_json([r.to_dict() for r in rows]))
        return
    total = fc.store.count(name)
    click.echo(f"{name}: {total} parked" + (f", first {len(rows)} shown" if total > len(rows) else ""))
    click.echo(table(["TASK", "NAME", "PRIORITY", "KEY", "REASON", "WAKE AT", "ATTEMPTS"],
                     [[r.task_id, r.task_name, r.priority, r.fairness_key or "-", r.reason,
                       when(r.wake_at), r.attempts] for r in rows]))


@flowcontrol.command()
@click.option("--timeout", default=1.0, show_default=True, type=click.FloatRange(0.1, 60),
              help="Seconds to wait for replies.")
@json_option
@click.pass_context
@one_line_errors
def workers(ctx: click.Context, timeout: float, as_json: bool) -> None:
    """The autoscaler and admission figures of each worker (``inspect flowcontrol_stats``)."""
    try:
        replies = worker_stats(_app(ctx), timeout)
    except Exception as exc:  # kombu raises its own errors for an unreachable broker
        raise click.ClickException(f"can't reach the broker: {type(exc).__name__}: {exc}") from exc
    if as_json:
        click.echo(to_json(replies))
    if not replies:
        raise click.ClickException(f"no worker answered flowcontrol_stats within {timeout:g}s")
    if as_json:
        return
    rows = []
    for node, figures in replies.items():
        a = figures.get("autoscaler") or {}
        adm = figures.get("admission") or {}
        last = a.get("last_adjustment") or {}
        rows.append([node, a.get("limit"), a.get("inflight"), _mib(a.get("rss_bytes")),
                     a.get("cpu_pct"), a.get("throughput"), a.get("p95_ms"),
                     f"{last.get('previous')}->{last.get('limit')} {last.get('reason')}" if last else "-",
                     _per_queue(adm.get("held")), adm.get("parked")])
    click.echo(table(["WORKER", "LIMIT", "IN FLIGHT", "RSS MiB", "CPU %", "TASKS/S", "P95 ms",
                      "LAST ADJUSTMENT", "SLOTS HELD", "PARKED IN ALL"], rows))


def _mib(value: Any) -> str | None:
    return None if not isinstance(value, (int, float)) else f"{value / 2**20:.1f}"


def _per_queue(counts: Any) -> str | None:
    """``{"api": 2, "b": 1}`` as ``api:2 b:1`` (a worker's slots held, by queue)."""
    if not isinstance(counts, dict):
        return None
    return " ".join(f"{q}:{n}" for q, n in sorted(counts.items())) or "-"


# -- steering ------------------------------------------------------------------------------------


@flowcontrol.command()
@click.argument("slot_id", metavar="SLOT")
@click.option("--yes", is_flag=True, help="Really release it (the task may still be running).")
@json_option
@click.pass_context
@one_line_errors
def release(ctx: click.Context, slot_id: str, yes: bool, as_json: bool) -> None:
    """Free busy slot SLOT now (its task keeps running; the slot goes to the next waiter)."""
    if not yes:
        raise Refusal(f"refusing to release slot {slot_id!r} without --yes")
    queue = changes.release(flow_control(ctx), slot_id)
    if as_json:
        click.echo(to_json({"released": slot_id, "queue": queue}))
    else:
        click.echo(f"released slot {slot_id} of {queue}")


@flowcontrol.command()
@click.argument("name")
@click.argument("value", metavar="N|reset")
@json_option
@click.pass_context
@one_line_errors
def capacity(ctx: click.Context, name: str, value: str, as_json: bool) -> None:
    """Override queue NAME's capacity (0 pauses it), or `reset` it to config."""
    row = changes.set_capacity(flow_control(ctx), name, value)
    if as_json:
        click.echo(to_json(row.to_dict()))
    else:
        what = "reset to config" if row.capacity_override is None else "overridden"
        click.echo(f"{name}: capacity {capacity_text(row.capacity, None)} ({what}), "
                   f"{row.in_use} busy, {row.waiting} waiting")


@flowcontrol.command(name="max-hold")
@click.argument("name")
@click.argument("value", metavar="DURATION|reset")
@json_option
@click.pass_context
@one_line_errors
def max_hold(ctx: click.Context, name: str, value: str, as_json: bool) -> None:
    """Override queue NAME's max hold ("45m", "2h", seconds), or `reset` it; later slots only."""
    row = changes.set_max_hold(flow_control(ctx), name, value)
    if as_json:
        click.echo(to_json(row.to_dict()))
    else:
        what = "reset to config" if row.max_hold_override is None else "overridden"
        click.echo(f"{name}: max hold {duration(row.max_hold)} ({what}), applies to slots granted from now on")


@flowcontrol.command()
@click.option("--url", default=None, help="Parking database URL (default: flowcontrol_parking_url).")
@click.pass_context
@one_line_errors
def migrate(ctx: click.Context, url: str | None) -> None:
    """Create or upgrade the parking tables (run before a deploy)."""
    if url is None:
        from ..flowcontrol import FlowControl

        settings = FlowControl(_app(ctx)).settings
        if not _app_named(ctx) and settings.parking_url == DEFAULT_PARKING_URL:
            # The default URL is relative: it would make a file wherever this shell stands.
            raise Refusal("no app and no parking URL: run `celery -A proj flowcontrol migrate` "
                          "(proj: the module of your Celery app), or name the database with "
                          "--url; refusing to create ./flowcontrol.sqlite3 here")
        url = settings.parking_url
    shown = schema.migrate(url)
    click.echo(f"parking tables at {shown} are up to date")


@flowcontrol.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=5566, show_default=True, type=click.IntRange(0, 65535))
@click.option("--token", default=None, envvar="FLOWCONTROL_DASHBOARD_TOKEN",
              help="Token that unlocks changes (default: flowcontrol_dashboard_token; none: read-only).")
@click.pass_context
@one_line_errors
def dashboard(ctx: click.Context, host: str, port: int, token: str | None) -> None:
    """Serve the web dashboard and /metrics (127.0.0.1:5566 by default)."""
    from ..dashboard import need_dependencies, serve

    need_dependencies()  # the missing extra is named before any address is printed
    fc = flow_control(ctx)
    token = token or fc.settings.dashboard_token
    mode = "changes need the token" if token else "read-only (no token set)"
    click.echo(f"flowcontrol dashboard on http://{host}:{port}/ ({mode}); Ctrl-C stops it", err=True)
    sys.stderr.flush()
    serve(fc, host=host, port=port, token=token)
