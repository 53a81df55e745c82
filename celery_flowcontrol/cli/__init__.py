"""The ``celery flowcontrol`` command line (``celery.commands`` entry point)."""

from __future__ import annotations

from .commands import flowcontrol

__all__ = ["flowcontrol"]
