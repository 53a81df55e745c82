"""celery-flowcontrol: durable, fleet-wide flow control for Celery tasks."""
