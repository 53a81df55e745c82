"""The ``celery`` command as the harness runs it (``python -m tests.support.celery_command
-A proj worker ...``): Celery's own entry point, unchanged up to its exit, then no final sweep
of the interpreter.

After a worker's warm shutdown, Python's finalization collects the garbage of every module
once more, which on a busy two-core machine takes longer than the shutdown itself (seconds
per worker, paid by every test at teardown). Nothing a test observes happens there: by then
the worker has stopped, its ``worker_shutdown`` receivers (flow control's among them) have
run, non-daemon threads have been joined and every ``atexit`` handler (the log files'
flush among them) runs before this one, which was registered first and so runs last. It
ends the process with the exit status Celery chose.
"""

from __future__ import annotations

import atexit
import os
import sys

status = 1  # an exception other than SystemExit escaped Celery: Python's own status for it


def _exit_now() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


atexit.register(_exit_now)  # before Celery's imports: the last handler to run


def main() -> None:
    global status
    from celery.__main__ import main as celery_main

    try:
        celery_main()
    except SystemExit as exc:
        # What the interpreter would exit with: None is 0, a number itself, anything else 1.
        code = exc.code
        status = 0 if code is None else code if isinstance(code, int) else 1
        raise


if __name__ == "__main__":
    main()
