"""Run the benchmarks, each in its quick profile: ``python -m benchmarks [name ...]``
(``--quick`` is accepted and changes nothing; an unknown name stops the run before any).

Every module ``benchmarks/<name>.py`` with a ``main`` is run in turn (all of them, or the
ones named), except helpers: names starting with ``_``, modules that set
``BENCHMARK = False``, and those in :data:`NOT_BENCHMARKS`. How ``main`` is called:

* ``main(quick: bool = False)`` (the preferred form) gets ``quick=True``;
* any other ``main`` is called with no arguments and ``sys.argv`` holding only the script
  name, so its command line defaults apply (make the default the quick profile).

``main`` may return ``False`` or a non-zero int for a missed target; the exit status is 1
when any did (or raised), else 0.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import time
import traceback
from pathlib import Path

#: Modules with a ``main`` that are not benchmarks (a server that runs until killed, an app).
NOT_BENCHMARKS = {"knee_server", "autoscale_app", "report"}


def benchmark_names() -> list[str]:
    """Every benchmark module of this package, sorted."""
    here = Path(__file__).parent
    names = []
    for info in pkgutil.iter_modules([str(here)]):
        if info.name.startswith("_") or info.name in NOT_BENCHMARKS:
            continue
        names.append(info.name)
    return sorted(names)


def run_one(name: str) -> bool:
    """Import ``benchmarks.<name>`` and run its ``main`` in the quick profile."""
    module = importlib.import_module(f"benchmarks.{name}")
    main = getattr(module, "main", None)
    if main is None or getattr(module, "BENCHMARK", True) is False:
        print(f"(benchmarks.{name}: no benchmark main, skipped)")
        return True
    saved = sys.argv
    sys.argv = [f"benchmarks/{name}.py"]
    try:
        if "quick" in inspect.signature(main).parameters:
            result = main(quick=True)
        else:
            result = main()
    finally:
        sys.argv = saved
    return result is not False and not (isinstance(result, int) and not isinstance(result, bool)
                                        and result != 0)


def main(argv: list[str] | None = None) -> int:
    """Run the named benchmarks (default: all); 1 if any missed its target or failed."""
    from benchmarks import report

    args = list(argv if argv is not None else sys.argv[1:])
    # Every run here is the quick profile already; say so rather than take the flag for a name.
    names = [a for a in args if a != "--quick"] or benchmark_names()
    unknown = [n for n in names if n not in benchmark_names()]
    if unknown:
        print(f"no such benchmark: {', '.join(unknown)} (known: {', '.join(benchmark_names())}; "
              f"a full profile: python -m benchmarks.<name>)", file=sys.stderr)
        return 2
    report.install()  # collects each module's figures and series for REPORT.md
    failed = []
    for name in names:
        print(f"\n=== benchmarks.{name} (quick) ===", flush=True)
        report.begin(name)
        started = time.perf_counter()
        try:
            ok = run_one(name)
        except Exception:
            traceback.print_exc()
            ok = False
        print(f"=== benchmarks.{name}: {'ok' if ok else 'MISSED'} "
              f"({time.perf_counter() - started:.0f} s) ===", flush=True)
        report.RESULTS[name].ok, report.RESULTS[name].seconds = ok, time.perf_counter() - started
        if not ok:
            failed.append(name)
    print(f"\nreport: {report.write()}")
    if failed:
        print(f"\nmissed or failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
