"""The ``celery flowcontrol`` command line (``celery.commands`` entry point)."""

from __future__ import annotations

from . import dead as _dead  # noqa: F401 - registers the `dead` verb on the group
from .commands import flowcontrol

__all__ = ["flowcontrol"]
