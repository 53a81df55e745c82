"""Alembic revisions of the parking tables (Alembic skips this file)."""
