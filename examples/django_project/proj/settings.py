"""Django settings of the example project: Celery's under the ``CELERY_`` namespace
(proj/celery.py reads them with ``namespace="CELERY"``), flow control's among them as
``CELERY_FLOWCONTROL_*``. Where things run comes from the environment, as in most deployments.
"""

from __future__ import annotations

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = False
ALLOWED_HOSTS: list[str] = []
INSTALLED_APPS = ["shop"]
DATABASES: dict[str, dict[str, str]] = {}  # the example keeps nothing in Django's database
USE_TZ = True
TIME_ZONE = "UTC"

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

# -- Celery ---------------------------------------------------------------------------------
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_TASK_DEFAULT_QUEUE", "celery")
# What makes a cap exact (docs/worker.md): no prefetched message escapes admission, and none
# is acked before it ran.
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_REJECT_ON_WORKER_LOST = True

# -- flow control (docs/settings.md) ----------------------------------------------------------
# The payment provider takes at most 2 charges at once and 600 a minute, whatever the number
# of workers and pool processes.
CELERY_FLOWCONTROL_QUEUES = [
    {"name": "payments", "concurrency": 2, "rate_limit": "600/m"},
]
CELERY_FLOWCONTROL_BACKEND_URL = REDIS_URL  # one admission state for every worker
CELERY_FLOWCONTROL_KEY_PREFIX = os.environ.get("FLOWCONTROL_KEY_PREFIX", "fc")
CELERY_FLOWCONTROL_PARKING_URL = os.environ.get(
    "FLOWCONTROL_PARKING_URL", f"sqlite:///{BASE_DIR / 'flowcontrol.sqlite3'}")
