"""The knee server: a loopback HTTP downstream whose best concurrency is K, and its ground truth.

``GET /work`` behaves like a service with K slots:

* up to K requests in flight, each takes lognormal(mean 50 ms, sigma 0.2);
* above K, requests queue for a slot, and every request above K adds 3% to service time, so
  running more than K at once only makes things slower (the "knee");
* above 2K in flight, a fast ``503``;
* during a stall (``/control?stall=SECONDS``) requests hang until the stall ends.

``/control?k=N`` changes K, ``/log?since=EPOCH`` returns every request as JSON lines
``[arrived, finished, status, inflight_on_arrival]`` (wall-clock seconds): the ground truth the
benchmark computes throughput, p95, errors and RAM from. One asyncio loop, no threads, so it costs
little CPU on a small machine::

    python benchmarks/knee_server.py --port 8765 --k 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections import deque
from urllib.parse import parse_qs, urlsplit


class Knee:
    """State of the downstream: K, slots, stall and the request log."""

    def __init__(self, k: int, base: float = 0.050, sigma: float = 0.2, penalty: float = 0.03, seed: int = 1):
        self.k = k
        self.base, self.sigma, self.penalty = base, sigma, penalty
        self.rng = random.Random(seed)
        self.inflight = 0
        self.busy = 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.stall_until = 0.0
        self.log: list[tuple[float, float, int, int]] = []

    def _service(self) -> float:
        mu = math.log(self.base) - self.sigma**2 / 2  # mean = base
        return self.rng.lognormvariate(mu, self.sigma) * (1 + self.penalty * max(0, self.inflight - self.k))

    def _release(self) -> None:
        self.busy -= 1
        while self.waiting and self.busy < self.k:
            fut = self.waiting.popleft()
            if not fut.done():
                self.busy += 1
                fut.set_result(None)

    async def work(self) -> int:
        """Serve one request; returns the HTTP status."""
        arrived = time.time()
        if self.inflight + 1 > 2 * self.k:
            self.log.append((arrived, time.time(), 503, self.inflight))
            return 503
        self.inflight += 1
        seen = self.inflight
        try:
            if self.busy < self.k:
                self.busy += 1
            else:
                fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self.waiting.append(fut)
                await fut
            try:
                stall = self.stall_until - time.time()
                await asyncio.sleep(max(stall, 0.0) + self._service())
            finally:
                self._release()
        finally:
            self.inflight -= 1
        self.log.append((arrived, time.time(), 200, seen))
        return 200


async def handle(knee: Knee, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Minimal HTTP/1.0-style handler: one request per connection."""
    try:
        line = (await reader.readline()).decode("latin-1")
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass
        parts = line.split()
        url = urlsplit(parts[1] if len(parts) > 1 else "/")
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        status, body = 200, b"ok"
        if url.path == "/work":
            status = await knee.work()
            body = b"busy" if status == 503 else b"ok"
        elif url.path == "/control":
            if "k" in query:
                knee.k = int(query["k"])
            if "stall" in query:
                knee.stall_until = time.time() + float(query["stall"])
            body = json.dumps({"k": knee.k, "inflight": knee.inflight}).encode()
        elif url.path == "/log":
            since = float(query.get("since", 0))
            body = "\n".join(json.dumps(r) for r in knee.log if r[0] >= since).encode()
        else:
            status, body = 404, b"not found"
        reason = {200: "OK", 503: "Service Unavailable", 404: "Not Found"}[status]
        head = f"HTTP/1.0 {status} {reason}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        writer.write(head.encode() + body)
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass  # the client gave up (its timeout): the log already has or will have the request
    finally:
        writer.close()


async def serve(port: int, k: int) -> None:
    """Serve forever on 127.0.0.1:``port``."""
    knee = Knee(k)
    server = await asyncio.start_server(lambda r, w: handle(knee, r, w), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    """Command line: ``--port`` and the starting ``--k``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--k", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.k))


if __name__ == "__main__":
    main()
