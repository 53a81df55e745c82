"""The Django project. Its Celery app is loaded with Django, as Celery's Django guide does it,
so that ``shared_task`` binds to it."""

from __future__ import annotations

from .celery import app as celery_app

__all__ = ("celery_app",)
