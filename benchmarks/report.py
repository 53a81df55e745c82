"""The benchmark report: ``python -m benchmarks`` collects every module's figures into
``benchmarks/REPORT.md`` (figure, baseline, ratio, target, with the machine and versions) and
draws one PNG per benchmark into ``benchmarks/charts/``.

The modules print their own tables; :func:`install` wraps the few functions through which
their figures and raw series pass (the shared ``_fleet.table``, ``admission.format_table``,
``parking.run``, ``autoscale.measure`` and ``Bench.run``, ``wake_latency.gaps``,
``contended.max_overlap``; ``soak`` keeps ``ROWS``/``SERIES``), so no module has to change
how it measures. Not a benchmark itself (``BENCHMARK = False``).
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib
import json
import os
import platform
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCHMARK = False
HERE = Path(__file__).parent
CHARTS = HERE / "charts"


@dataclass
class Figure:
    """One line of the report."""

    figure: str
    measured: float | None
    baseline: float | None
    unit: str
    ratio: float | None
    target: str
    ok: bool


@dataclass
class Result:
    """What one benchmark module gave: figures, raw series, whether it met its targets."""

    name: str
    ok: bool = True
    seconds: float = 0.0
    figures: list[Figure] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
    charts: list[tuple[str, str]] = field(default_factory=list)  # (file, description)


RESULTS: dict[str, Result] = {}
_current: list[str] = [""]


def _res() -> Result:
    return RESULTS.setdefault(_current[0], Result(_current[0]))


def begin(name: str) -> None:
    """Figures recorded from now on belong to benchmark ``name``."""
    _current[0] = name
    _res()


def _wrap(module: Any, attr: str, after: Any) -> None:
    """Replace ``module.attr`` by a call-through that hands (args, result) to ``after``."""
    inner = getattr(module, attr)
    if getattr(inner, "_reported", False):
        return

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = inner(*args, **kwargs)
        try:
            after(args, kwargs, result)
        except Exception as exc:  # noqa: BLE001 - a report must never break a benchmark
            print(f"(report: could not record {attr}: {exc!r})")
        return result

    wrapper._reported = True  # type: ignore[attr-defined]
    setattr(module, attr, wrapper)


def install() -> None:
    """Wrap the functions the figures pass through (see the module docstring)."""
    fleet = importlib.import_module("benchmarks._fleet")

    def fleet_rows(args: Any, kwargs: Any, result: Any) -> None:
        title, rows = args[0], args[1]
        for r in rows:
            _res().figures.append(Figure(f"{r.figure}", r.measured, r.baseline, r.unit, r.ratio, r.target, r.ok))
        _res().series.setdefault("titles", []).append(title)

    _wrap(fleet, "table", fleet_rows)
    for name in ("throughput", "contended", "wake_latency", "parked_memory", "soak"):
        module = importlib.import_module(f"benchmarks.{name}")
        if hasattr(module, "table"):
            module.table = fleet.table  # they imported it by name before the wrap
    adm = importlib.import_module("benchmarks.admission")
    _wrap(adm, "format_table", lambda a, k, r: _res().figures.extend(
        Figure(f, v, b, "us" if ": us at" in f else "/s", ratio, t or "-", ok)
        for f, v, b, ratio, t, ok in a[0]))
    park = importlib.import_module("benchmarks.parking")
    _wrap(park, "run", lambda a, k, r: _res().figures.extend(
        Figure(f"{db}: {op.strip()}", rate, r[0][2], "ops/s", ratio,
               f">= {park.TARGET} x raw" if op.startswith("park + wake") else "-",
               ratio >= park.TARGET or not op.startswith("park + wake")) for db, op, rate, ratio in r))
    wake = importlib.import_module("benchmarks.wake_latency")
    _wrap(wake, "gaps", lambda a, k, r: _res().series.setdefault(
        "flow" if (a[2] if len(a) > 2 else k.get("flow")) else "baseline", []).extend(r))
    cont = importlib.import_module("benchmarks.contended")
    # measure() calls max_overlap() for the baseline's fleets too: keep only the flow-controlled
    # runs (the chart is the first of them), told apart once measure() returns.
    _wrap(cont, "max_overlap", lambda a, k, r: _res().series.__setitem__(
        "last_runs", [(x.start, x.end) for x in a[0]]))

    def measured(args: Any, kwargs: Any, result: Any) -> None:
        runs = _res().series.pop("last_runs", None)
        if runs is not None and (args[3] if len(args) > 3 else kwargs.get("flow")):
            _res().series.setdefault("runs", []).append(runs)

    _wrap(cont, "measure", measured)
    auto = importlib.import_module("benchmarks.autoscale")
    _wrap(auto, "measure", lambda a, k, r: _res().figures.extend(
        Figure(t.name, t.value, None, "", None, t.bound, t.ok) for t in r))
    _wrap(auto.Bench, "run", lambda a, k, r: _res().series.setdefault("arms", []).append(
        (a[1], k.get("k", a[5] if len(a) > 5 else 8),
         [(t, e.get("limit")) for t, e in r.limits()])))


# -- charts ----------------------------------------------------------------------------------

def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, result: Result, file: str, description: str) -> None:
    CHARTS.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(CHARTS / file, dpi=90)
    _plt().close(fig)
    result.charts.append((file, description))


def _inflight(intervals: list[tuple[float, float | None]]) -> tuple[list[float], list[int]]:
    events = sorted([(s, 1) for s, _ in intervals] + [(e if e is not None else s, -1) for s, e in intervals],
                    key=lambda e: (e[0], e[1]))
    xs, ys, n = [], [], 0
    for t, d in events:
        xs.append(t)
        ys.append(n)
        n += d
        xs.append(t)
        ys.append(n)
    return xs, ys


def _bars(result: Result, file: str, title: str) -> None:
    figs = [f for f in result.figures if f.measured is not None and f.baseline not in (None, 0)][:10]
    if not figs:
        return
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(figs) + 1.5))
    ratios = [f.measured / f.baseline for f in figs]  # type: ignore[operator]
    ax.barh([f.figure[:60] for f in figs], ratios, color=["tab:green" if f.ok else "tab:red" for f in figs])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("measured / baseline")
    ax.set_title(title)
    ax.invert_yaxis()
    _save(fig, result, file, f"{title}: each figure as a ratio to its baseline (1.0 = the baseline; "
                             "red = target missed)")


def draw(result: Result) -> None:
    """The chart(s) of one benchmark."""
    plt = _plt()
    name, s = result.name, result.series
    if name == "wake_latency" and s.get("flow"):
        fig, ax = plt.subplots(figsize=(7, 4))
        for key, style in (("flow", "-"), ("baseline", "--")):
            values = sorted(s.get(key, []))
            if values:
                ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], style, label=key)
        ax.set_xscale("log")
        ax.set_xlabel("hand-over: previous task's end to next task's start (ms)")
        ax.set_ylabel("fraction of hand-overs")
        ax.legend()
        ax.set_title("wake latency CDF")
        _save(fig, result, "wake_latency_cdf.png", "CDF of the hand-over time from a task's end to the next "
              "waiter's start, flow-controlled (cap 1, parked waiters) against plain Celery")
    elif name == "contended" and s.get("runs"):
        runs = s["runs"][0]
        t0 = min(a for a, _ in runs)
        xs, ys = _inflight([(a - t0, (b - t0) if b else None) for a, b in runs])
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.plot(xs, ys, lw=0.8, label="in flight (task-measured)")
        cap = importlib.import_module("benchmarks.contended").CAP
        ax.axhline(cap, color="r", ls="--", label=f"cap {cap}")
        ax.set_xlabel("s")
        ax.legend(loc="lower right")
        ax.set_title("contended queue: in flight over time against the cap")
        _save(fig, result, "contended_inflight.png", "tasks in flight over time (first flow-controlled run) "
              "against the queue's cap")
    elif name == "autoscale" and s.get("arms"):
        fig, ax = plt.subplots(figsize=(8, 4))
        for arm, k, limits in s["arms"]:
            pts = [(t, v) for t, v in limits if v is not None]
            if pts:
                t0 = pts[0][0]
                ax.step([t - t0 for t, _ in pts], [v for _, v in pts], where="post", label=f"{arm} (K={k})")
        ks = {k for _, k, _ in s["arms"]}
        for k in ks:
            ax.axhline(k, color="k", ls=":", lw=0.8)
        ax.set_xlabel("s since the arm's first event")
        ax.set_ylabel("pool limit")
        ax.legend(fontsize=7)
        ax.set_title("autoscaler limit against the knee K")
        _save(fig, result, "autoscale_limit.png", "each autoscaler arm's live pool limit over time; dotted "
              "lines: the knee server's best fixed concurrency K")
    elif name == "soak" and (s := importlib.import_module("benchmarks.soak").SERIES).get("conc_runs"):
        fig, axes = plt.subplots(3, 1, figsize=(9, 8))
        xs, ys = _inflight(s["conc_runs"])
        axes[0].plot(xs, ys, lw=0.5)
        axes[0].axhline(s["cap"], color="r", ls="--", label=f"cap {s['cap']}")
        axes[0].set_title("soak: conc in flight over time")
        axes[0].legend(loc="lower right")
        adm = sorted(s["slide_admitted"])
        j, counts = 0, []
        for i, t in enumerate(adm):
            while adm[j] <= t - 1.0:
                j += 1
            counts.append(i - j + 1)
        axes[1].plot(adm, counts, ".", ms=1.5)
        axes[1].axhline(s["slide_limit"], color="r", ls="--", label=f"limit {s['slide_limit']}/s")
        axes[1].set_title("soak: sliding window, admissions in the trailing 1 s")
        axes[1].legend(loc="lower right")
        for node in sorted({n for _, d in s["rss"] for n in d}):
            pts = [(t, d[node]) for t, d in s["rss"] if node in d]
            axes[2].plot([t for t, _ in pts], [v for _, v in pts], label=node)
        axes[2].set_title("soak: worker node RSS (main + pool), MB")
        axes[2].set_xlabel("s")
        axes[2].legend(loc="lower right")
        _save(fig, result, "soak.png", "soak: conc in flight against its cap; sliding-window admissions in "
              "the trailing second against the limit; each node's RSS over the run")
    else:
        _bars(result, f"{name}.png", name.replace("_", " "))


# -- the markdown -----------------------------------------------------------------------------

def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def machine() -> list[str]:
    """Lines that say where and with what the figures were measured."""
    from importlib.metadata import version

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), "0")
    libs = ", ".join(f"{p} {version(p)}" for p in ("celery", "kombu", "redis", "SQLAlchemy", "psycopg",
                                                       "dramatiq", "limits"))
    return [
        f"- machine: {platform.node()}, {cpu}, {os.cpu_count()} cores, {int(mem) // 1024} MB RAM, "
        f"{platform.system()} {platform.release()}; load average at the end {os.getloadavg()[0]:.1f} "
        "(other test runs share this machine)",
        f"- Python {platform.python_version()}; {libs}",
        f"- {_run('redis-server', '--version').split(' sha')[0]}; "
        f"{_run('psql', '-h', '127.0.0.1', '-U', 'postgres', '-tAc', 'SHOW server_version', 'test') or 'PostgreSQL ?'}"
        " (PostgreSQL); broker: Redis",
        f"- commit {_run('git', '-C', str(HERE.parent), 'rev-parse', '--short', 'HEAD')}, "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, each module in its quick profile",
    ]


def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}"
    return f"{text} {unit}".strip()


def _merge_previous(store: Path) -> None:
    """Keep the figures of benchmarks not run this time (``python -m benchmarks soak`` updates
    one section), from the JSON the last report left beside its charts."""
    if not store.exists():
        return
    for name, data in json.loads(store.read_text()).items():
        if name not in RESULTS:
            RESULTS[name] = Result(name, data["ok"], data["seconds"],
                                   [Figure(**f) for f in data["figures"]], {},
                                   [tuple(c) for c in data["charts"]])  # type: ignore[misc]


def write(path: Path = HERE / "REPORT.md") -> Path:
    """Draw every chart and write the report (with the last report's other sections)."""
    store = CHARTS / "results.json"
    fresh = set(RESULTS)
    _merge_previous(store)
    lines = ["# Benchmark report", "", "`python -m benchmarks` (or `tox -e bench`): every benchmark in its "
             "quick profile; figures beside their same-run baselines.", "", *machine(), ""]
    summary = ["| benchmark | result | time |", "| --- | --- | --- |"]
    body: list[str] = []
    for result in RESULTS.values():
        if not result.name:
            continue
        try:
            if result.name in fresh:
                result.charts.clear()
                draw(result)
        except Exception as exc:  # noqa: BLE001 - a missing chart is reported, not fatal
            body.append(f"(chart of {result.name} failed: {exc!r})")
        summary.append(f"| [{result.name}](#{result.name.replace('_', '-')}) | "
                       f"{'met' if result.ok else '**MISSED**'} | {result.seconds:.0f} s |")
        body += ["", f"## {result.name}", "", "| figure | measured | baseline | ratio | target | ok |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for f in result.figures:
            body.append(f"| {f.figure} | {_num(f.measured, f.unit)} | {_num(f.baseline, f.unit)} | "
                        f"{_num(f.ratio)} | {f.target} | {'yes' if f.ok else '**no**'} |")
        if not result.figures:
            body.append("| (no figures recorded) | | | | | |")
        for file, description in result.charts:
            body += ["", f"![{result.name}](charts/{file})", "", f"*{description}.*"]
    path.write_text("\n".join([*lines, *summary, *body, ""]))
    CHARTS.mkdir(parents=True, exist_ok=True)
    store.write_text(json.dumps({r.name: {"ok": r.ok, "seconds": r.seconds, "charts": r.charts,
                                          "figures": [vars(f) for f in r.figures]}
                                 for r in RESULTS.values() if r.name}, indent=1))
    return path
