"""The Celery projects the worker harness runs (``create_app(env)`` each)."""
