"""The parking tables' schema, brought up to date (``celery flowcontrol migrate``)."""

from __future__ import annotations

from ..parking import migrate as run_migrations
from ..parking.engine import parking_url

__all__ = ["migrate"]


def migrate(url: str) -> str:
    """Create or upgrade the parking tables at *url*.

    :param url: a SQLAlchemy URL of the parking database.
    :returns: *url* as operators may be shown it (password hidden).
    """
    run_migrations(url)
    return parking_url(url).render_as_string(hide_password=True)
