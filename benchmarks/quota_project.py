"""The worker project of ``benchmarks/quota.py``'s fake-API arms: the e2e project plus one task.

``proj.call(tenant, estimate, published)`` makes one call to the loopback fake API
(:mod:`benchmarks.quota_api`, its URL in setting ``bench_quota["url"]``) and reads the true
token count from the reply. What it does around the call is the arm's (``bench_quota["arm"]``):

``celery``    plain Celery: ``rate_limit`` (``bench_quota["celery_rate"]``, per worker) and
              ``autoretry_for`` the 429 with Celery's exponential ``retry_backoff``
``known``     a ``FlowTask`` of flow queue ``llm``: ``flow_cost`` is the estimate, the key the
              tenant; ``settle_cost`` with the true count; ``FlowBackoff`` should a 429 come
``adaptive``  the same task (the queue's limits are adaptive ceilings instead)
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from celery import Celery

from tests.support.projects.base import create_app as create_base_app


class TooManyRequests(Exception):
    """The fake API's 429, with its Retry-After in seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"429, retry after {retry_after:g} s")
        self.retry_after = retry_after


def call_api(url: str, tenant: str, estimate: int, task_id: str, published: float) -> int:
    """One call; the true token count, or :class:`TooManyRequests`."""
    body = json.dumps({"tenant": tenant, "estimate": estimate, "task": task_id,
                       "published": published}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as reply:
            return int(json.loads(reply.read())["tokens"])
    except urllib.error.HTTPError as exc:
        if exc.code == 429:
            raise TooManyRequests(float(exc.headers.get("Retry-After", "1"))) from None
        raise


def create_app(env: Mapping[str, str]) -> Celery:
    """The base e2e app and ``proj.call`` as the arm in ``bench_quota`` makes it."""
    app = create_base_app(env)
    bench: dict[str, Any] = dict(app.conf.get("bench_quota") or {})
    url = str(bench.get("url", ""))
    if bench.get("arm", "celery") == "celery":

        @app.task(name="proj.call", shared=False, bind=True, rate_limit=bench.get("celery_rate"),
                  autoretry_for=(TooManyRequests,), retry_backoff=True, retry_jitter=True,
                  max_retries=None)
        def call(self: Any, tenant: str, estimate: int, published: float) -> int:
            return call_api(url, tenant, estimate, str(self.request.id), published)

        return app

    from celery_flowcontrol import FlowBackoff, FlowTask, settle_cost

    @app.task(name="proj.call", shared=False, bind=True, base=FlowTask, flow_queue="llm",
              flow_cost=lambda args, kwargs: args[1], fairness_key=lambda args, kwargs: args[0])
    def flow_call(self: Any, tenant: str, estimate: int, published: float) -> int:
        try:
            tokens = call_api(url, tenant, estimate, str(self.request.id), published)
        except TooManyRequests as exc:
            raise FlowBackoff(exc.retry_after) from None
        settle_cost(tokens)
        return tokens

    return app
