"""The loopback fake API of ``benchmarks/quota.py`` and one arm's run against it.

:class:`FakeAPI` enforces what an LLM provider does, on one account: at most ``requests`` calls
and ``tokens`` tokens in any ``window`` seconds (sliding), a call's true token count drawn at
0.5x to 1.5x its estimate (the client learns it from the reply, after the call), and a 429 with
``Retry-After`` (the seconds until that call would fit) when a call would go over. An accepted
call takes ``latency`` seconds. Every request is logged (:class:`Call`); the figures are read
from that log, so the API is the judge of what got through.

:func:`run_arm` runs one arm: two worker nodes (prefork, ``-c 4``), a heavy tenant's backlog
sent at once and a light tenant's calls every ``light_every`` seconds while it lasts.
"""

from __future__ import annotations

import http.server
import json
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

from benchmarks._fleet import fleet, percentile
from tests.support.harness import Harness, wait_for


@dataclass(frozen=True)
class Quota:
    """The provider's limits and the load: one profile of the benchmark."""

    window: float = 10.0
    requests: int = 150
    tokens: int = 40_000
    latency: float = 0.05
    estimate: tuple[int, int] = (200, 600)  # each call's estimate, uniform
    heavy: int = 1000                       # the heavy tenant's backlog
    light_every: float = 2.5                # seconds between the light tenant's calls
    light_alone: int = 24                   # the light tenant's calls with no heavy tenant
    longest: int = 14                       # windows an arm may run (then it is stopped)


@dataclass(frozen=True)
class Call:
    """One request the fake API saw."""

    at: float
    tenant: str
    task: str
    published: float
    status: int
    tokens: int


class FakeAPI(http.server.ThreadingHTTPServer):
    """Sliding request and token limits on one account; logs every request."""

    daemon_threads = True

    def __init__(self, quota: Quota, seed: int = 7) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.quota = quota
        self.lock = threading.Lock()
        self.window: deque[tuple[float, int]] = deque()  # (when, true tokens) accepted
        self.used = 0
        self.calls: list[Call] = []
        self.rng = random.Random(seed)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/complete"

    def decide(self, tenant: str, estimate: int, task: str, published: float) -> tuple[int, float]:
        """(true tokens, 0) for an accepted call, (0, retry after) for a 429."""
        q, now = self.quota, time.time()
        with self.lock:
            while self.window and self.window[0][0] <= now - q.window:
                self.used -= self.window.popleft()[1]
            tokens = max(1, round(estimate * self.rng.uniform(0.5, 1.5)))
            if len(self.window) < q.requests and self.used + tokens <= q.tokens:
                self.window.append((now, tokens))
                self.used += tokens
                self.calls.append(Call(now, tenant, task, published, 200, tokens))
                return tokens, 0.0
            # Retry-After: when enough of the window has left for this call to fit.
            count, used, retry = len(self.window), self.used, q.window
            for when, spent in self.window:
                count, used = count - 1, used - spent
                if count < q.requests and used + tokens <= q.tokens:
                    retry = when + q.window - now
                    break
            self.calls.append(Call(now, tenant, task, published, 429, tokens))
            return 0, max(0.01, retry)

    def log(self) -> list[Call]:
        with self.lock:
            return list(self.calls)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeAPI

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tokens, retry = self.server.decide(asked["tenant"], int(asked["estimate"]), asked["task"],
                                           float(asked["published"]))
        if not tokens:
            self.send_response(429)
            self.send_header("Retry-After", f"{retry:.3f}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        time.sleep(self.server.quota.latency)
        body = json.dumps({"tokens": tokens}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class QuotaHarness(Harness):
    """The e2e harness running :mod:`benchmarks.quota_project`."""

    project: ClassVar[str] = "benchmarks.quota_project"


@dataclass
class Figures:
    """What one arm got through the fake API."""

    calls: int = 0
    rejected: int = 0
    calls_late: int = 0        # from the fourth window on
    rejected_late: int = 0
    use: float = 0.0           # accepted tokens per window / the token limit, while the backlog lasts
    use_late: float = 0.0      # the same from the fourth window on
    windows: list[float] = field(default_factory=list)
    light_p95: float = 0.0     # seconds from a light call's send to its accepted call
    light_p50: float = 0.0
    seconds: float = 0.0
    light_waits: list[float] = field(default_factory=list)
    parked: int = 0            # parks and admissions the workers counted (ours only)
    admitted: int = 0

    @property
    def share(self) -> float:
        return self.rejected / max(1, self.calls)

    @property
    def share_late(self) -> float:
        return self.rejected_late / max(1, self.calls_late)


def figures(calls: list[Call], quota: Quota, light: list[tuple[str, float]],
            stopped: float) -> Figures:
    """The figures of one arm's log (see :class:`Figures`); *light* the light tenant's
    (task id, sent at), *stopped* when the arm was stopped."""
    out = Figures(calls=len(calls), rejected=sum(c.status == 429 for c in calls))
    if not calls:
        return out
    t0 = min(c.at for c in calls)
    heavy = [c.at for c in calls if c.tenant == "heavy" and c.status == 200]
    end = max(heavy) if heavy else max(c.at for c in calls)
    out.seconds = end - t0
    late = [c for c in calls if c.at >= t0 + 3 * quota.window]
    out.calls_late, out.rejected_late = len(late), sum(c.status == 429 for c in late)
    k = 0
    while t0 + (k + 1) * quota.window <= end:
        lo, hi = t0 + k * quota.window, t0 + (k + 1) * quota.window
        out.windows.append(sum(c.tokens for c in calls if c.status == 200 and lo <= c.at < hi)
                           / quota.tokens)
        k += 1
    if out.windows:
        out.use = sum(out.windows) / len(out.windows)
    if len(out.windows) > 3:
        out.use_late = sum(out.windows[3:]) / len(out.windows[3:])
    # A light call not through by the end waited at least until then.
    through = {c.task: c.at for c in calls if c.status == 200}
    waits = [through.get(task, stopped) - sent for task, sent in light]
    out.light_p95, out.light_p50 = percentile(waits, 95), percentile(waits, 50)
    out.light_waits = waits
    return out


def run_arm(arm: str, queue: dict[str, Any] | None, quota: Quota, *, heavy: bool = True,
            celery_rate: str | None = None, light_calls: int | None = None) -> Figures:
    """One arm: the fake API, two nodes, the heavy backlog (if *heavy*) and the light calls
    (with no heavy backlog, *light_calls* of them, else :attr:`Quota.light_alone`)."""
    api = FakeAPI(quota)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    conf: dict[str, Any] = {"bench_quota": {"arm": arm, "url": api.url, "celery_rate": celery_rate}}
    if arm == "celery":
        # Celery's defaults: with acks_late and a prefetch of 1 on Redis a rate-limited task
        # waits for the broker's 1 s poll each time (celery#4378, #5927), a far worse baseline.
        conf.update(task_acks_late=False, worker_prefetch_multiplier=4)
    if queue is not None:
        conf["flowcontrol_queues"] = [queue]
    rng = random.Random(11)
    try:
        with fleet(conf, flow=arm != "celery", kind=QuotaHarness) as h:
            h.start_worker(4, name="w1")
            h.start_worker(4, name="w2")
            task = h.app.tasks["proj.call"]
            if heavy:
                with h.app.producer_or_acquire() as producer:
                    for _ in range(quota.heavy):
                        task.apply_async(("heavy", rng.randint(*quota.estimate), time.time()),
                                         producer=producer)
            light: list[tuple[str, float]] = []

            def accepted(tenant: str) -> int:
                return sum(c.tenant == tenant and c.status == 200 for c in api.log())

            deadline = time.time() + quota.longest * quota.window
            while time.time() < deadline:
                if heavy and accepted("heavy") >= quota.heavy:
                    break
                if not heavy and len(light) >= (light_calls or quota.light_alone):
                    break
                sent = time.time()
                light.append((task.apply_async(("light", rng.randint(*quota.estimate), sent)).id,
                              sent))
                time.sleep(quota.light_every)
            if time.time() < deadline:  # the backlog is through: the last light calls too
                wait_for(lambda: accepted("light") >= len(light), 4 * quota.window, 0.2,
                         f"arm {arm}'s light calls to get through")
            stopped = time.time()
            counts = worker_counts(h.app) if arm != "celery" else {}
    finally:
        api.shutdown()
        api.server_close()
    out = figures(api.log(), quota, light, stopped)
    out.parked, out.admitted = counts.get("parked", 0), counts.get("admitted", 0)
    return out


def worker_counts(app: Any) -> dict[str, int]:
    """The workers' admission counts (``flowcontrol_stats``), summed over the nodes."""
    total: dict[str, int] = {}
    for reply in app.control.broadcast("flowcontrol_stats", reply=True, timeout=2.0):
        for stats in reply.values():
            for name, value in (stats.get("admission") or {}).items():
                if name in ("parked", "admitted"):
                    total[name] = total.get(name, 0) + int(value)
    return total
