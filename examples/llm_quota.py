"""An LLM API's quota: requests and tokens per window, per tenant, settled after the call, 429s.

A loopback fake API (started here, in this process) enforces what a provider does: at most
``10`` requests and ``2400`` tokens in any ``2 s``, a response's true token count known only
after the call (0.5x to 1.5x the estimate), and a 429 with ``Retry-After`` when over. The
flow queue ``llm`` holds the same limits, counts each call's estimated tokens
(``flow_cost``), settles the true count (``settle_cost``), gives each tenant its own window
(``per_key_rate_limit``), and backs off when the API pushes back anyway (``FlowBackoff``):
the queue admits nothing until ``Retry-After`` has passed, the call is parked and runs again.

Run ``python examples/llm_quota.py [CALLS]`` (default 24).
"""

from __future__ import annotations

import http.server
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from typing import Any

from _run import make_app, worker

from celery_flowcontrol import FlowBackoff, FlowTask, settle_cost

WINDOW, REQUESTS, TOKENS = 2.0, 10, 2400
app = make_app("llm_quota", [{
    "name": "llm", "concurrency": 4,
    "rate_limit": [f"{REQUESTS}/{WINDOW:g}s",
                   {"limit": TOKENS, "period": WINDOW, "algorithm": "sliding", "per": "cost"}],
    "per_key_rate_limit": "8/2s",
}])


def estimate(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The tokens a prompt is expected to take (a real app would use a tokenizer)."""
    return 40 * len(kwargs["prompt"].split())


@app.task(base=FlowTask, bind=True, flow_queue="llm", flow_cost=estimate,
          fairness_key=lambda args, kwargs: kwargs["tenant"])
def complete(self: Any, prompt: str, tenant: str) -> dict[str, Any]:
    """One completion; its true token count is settled once the API reports it."""
    url = f"http://127.0.0.1:{os.environ['LLM_QUOTA_PORT']}/complete"
    request = urllib.request.Request(url, data=json.dumps({"prompt": prompt}).encode())
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            usage = json.loads(reply.read())["tokens"]
    except urllib.error.HTTPError as exc:
        if exc.code == 429:
            raise FlowBackoff(exc.headers.get("Retry-After", "1")) from None
        raise
    settle_cost(usage)
    return {"tenant": tenant, "tokens": usage}


class FakeAPI(http.server.ThreadingHTTPServer):
    """Sliding request and token limits, as a provider enforces them; counts its 429s."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.log: deque[tuple[float, int]] = deque()  # (when, tokens) of accepted calls
        self.rejected = 0
        self.accepted = 0
        self.rng = random.Random(7)


class Handler(http.server.BaseHTTPRequestHandler):
    server: FakeAPI

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
        api, now = self.server, time.time()
        with api.lock:
            while api.log and api.log[0][0] <= now - WINDOW:
                api.log.popleft()
            tokens = round(40 * len(prompt.split()) * api.rng.uniform(0.5, 1.5))
            used = sum(t for _, t in api.log)
            if len(api.log) >= REQUESTS or used + tokens > TOKENS:
                api.rejected += 1
                retry = max(0.1, api.log[0][0] + WINDOW - now) if api.log else WINDOW
                self.send_response(429)
                self.send_header("Retry-After", f"{retry:.2f}")
                self.end_headers()
                return
            api.log.append((now, tokens))
            api.accepted += 1
        body = json.dumps({"tokens": tokens}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def main(calls: int) -> int:
    api = FakeAPI()
    threading.Thread(target=api.serve_forever, daemon=True).start()
    os.environ["LLM_QUOTA_PORT"] = str(api.server_address[1])  # the worker inherits it
    prompts = [("heavy", "summarise " * 12), ("light", "hello there")]
    with worker(app, concurrency=4):
        results = [complete.apply_async(kwargs={"prompt": prompts[i % 2][1],
                                                "tenant": prompts[i % 2][0]})
                   for i in range(calls)]
        done = [r.get(timeout=180) for r in results]
    api.shutdown()
    tokens = sum(d["tokens"] for d in done)
    print(f"llm_quota: {len(done)} of {calls} calls done, {tokens} tokens settled, "
          f"{api.rejected} pushed back with 429 (each backed off and ran again)")
    return 0 if len(done) == calls and api.accepted == calls else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 24))
