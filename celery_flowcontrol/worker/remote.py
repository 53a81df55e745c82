"""Remote-control command that runs a backend call in a worker's main process.

The in-process (``memory://``) backend lives in the worker's main process, so a pool child,
another process or the CLI can't reach it directly; ``FlowControl.call_backend`` sends
the call here instead (``app.control.broadcast``), and this command answers from the main
process. Only the operator calls below may be run this way.
"""

from __future__ import annotations

from typing import Any

from celery.worker.control import control_command

from .runtime_registry import runtime_of

ALLOWED = {"release": ("slot_id",), "set_capacity": ("name", "capacity"),
           "set_max_hold": ("name", "seconds"), "settle": ("slot_id", "actual"),
           "backoff": ("queue", "seconds", "key"),
           "set_key": ("name", "key", "weight", "concurrency", "rate_limit", "reserve",
                       "max_waiting"),
           "reset_key": ("name", "key"), "pause": ("name", "key", "until"),
           "resume": ("name", "key")}


@control_command(args=[("method", str), ("arguments", dict)],
                 signature="<method> <arguments>")
def flowcontrol_call(state: Any, method: str, arguments: dict[str, Any] | None = None) -> Any:
    """Run an allowed admission-backend call in this worker's main process."""
    runtime = runtime_of(state.consumer.app)
    if runtime is None:
        return {"error": "flow control is not running on this worker"}
    if method not in ALLOWED:
        return {"error": f"method {method!r} may not be called remotely"}
    kwargs = {k: v for k, v in (arguments or {}).items() if k in ALLOWED[method]}
    try:
        return {"ok": plain(getattr(runtime.engines.backend, method)(**kwargs))}
    except Exception as exc:  # the caller gets the error; the worker goes on
        return {"error": f"{type(exc).__name__}: {exc}"}


def plain(value: Any) -> Any:
    """*value* as the JSON a reply carries (a key's settings, from ``set_key``, as the dict
    ``KeyConfig.parse`` reads back)."""
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else value
