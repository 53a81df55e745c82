"""The project's Celery app, exactly as Celery's "First steps with Django" has it, plus one
line: ``FlowControl(app)``. Every Celery setting, flow control's included, is in
proj/settings.py under the ``CELERY_`` namespace."""

from __future__ import annotations

import os

from celery import Celery

from celery_flowcontrol import FlowControl

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")

app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
FlowControl(app)
