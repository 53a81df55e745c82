"""Alembic migrations of the parking tables (installed as ``celery_flowcontrol._migrations``)."""
