"""Celery glue on the worker side: task, strategy, request, bootstep and remote control commands."""
