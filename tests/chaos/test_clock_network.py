"""One node's clock steps 30 s (forward, then backward), and one node loses its network to
Redis for 10 s. Real prefork nodes; task times come from the gauge server's clock.

What a node's clock can touch: the Redis backend reads Redis ``TIME`` for every decision, so
windows, slot expiries, heartbeats and grants never see it. The node's own clock still drives
its gate's ETA check, the wake-ups its poller claims (``claim_due(now)``) and the parking
lease it checks; a step forward wakes rows early (they are denied again and parked again: churn,
not a cap break), a step back delays what only that node's poller would wake (the other
nodes' pollers and grants still wake them).
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.fixtures import MakeHarness
from tests.support.harness import max_in_window, wait_for
from tests.support.projects.chaos import PARKING, ChaosHarness, down_for, verdict, wait_all
from tests.support.proxies import TcpProxy
from tests.support.services import RedisServer

QUEUES = [{"name": "cc", "concurrency": 2, "retry": 0.5},
          {"name": "sw", "rate_limit": {"limit": 5, "period": 2, "algorithm": "sliding"}, "retry": 0.5}]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("step", [30.0, -30.0])
@pytest.mark.gated()
def test_a_clock_step_on_one_node_keeps_the_cap_and_the_sliding_window(
        make_harness: MakeHarness, step: float) -> None:
    """Cap 2 (16 tasks of 0.3 s) and a sliding window of 5 per 2 s (20 tasks); one of two
    nodes has its clock stepped by ``step`` seconds 3 s into the run."""
    conf = {"flowcontrol_queues": QUEUES, "flowcontrol_grant_ttl": 5.0}
    h = make_harness(ChaosHarness, conf=conf)
    at = time.time() + 12  # both nodes take several seconds to start on this machine
    h.start_worker(2, name="skewed", env={"FCT_CLOCK_STEP": str(step), "FCT_CLOCK_STEP_AT": str(at),
                                          "FCT_TRACE": "1"})
    h.start_worker(2, name="steady", env={"FCT_TRACE": "1"})
    time.sleep(max(0.0, at - 3 - time.time()))
    labels = h.submit("cc", 16, 0.3, tag="c") + h.submit("sw", 20, 0.0, tag="s")
    wait_all(h, labels, ["cc", "sw"], timeout=75)
    runs = h.gauge.executions()
    cc = verdict(f"clock-step{step:+.0f}s (cap)", h, [x for x in labels if x.startswith("c")], 2)
    # The limit governs admission instants (Redis TIME, when the worker exposes them); start
    # times add dispatch latency and may put one more into a span (tests/e2e/test_rate.py).
    # Each admission counts once: a task run twice (the skewed node's poller can take a row
    # another node is waking as lapsed: at-least-once, counted below) may have both copies
    # let in on the one slot its ticket holds, and both runs then report that one instant.
    entries = {tuple(v.decode().split("|")) for v in h.gauge.client.lrange(h.gauge.key("admitted"), 0, -1)}
    admitted = [float(at) for label, at in entries if label.startswith("s")]
    starts = [r.start for r in runs if r.label.startswith("s")]
    exact = bool(admitted)
    in_window, _ = max_in_window(admitted if exact else starts, 2.0)
    sw = verdict(f"clock-step{step:+.0f}s (sliding 5/2s)", h, [x for x in labels if x.startswith("s")],
                 5, extra=f"most {'admissions' if exact else 'starts'} in any 2 s window: {in_window} "
                           f"(limit 5); skewed node ran "
                           f"{sum(r.node == 'skewed' for r in runs)} of {len(runs)}")
    assert not cc["missing"] and not sw["missing"]
    assert cc["peak"] <= 2 and in_window <= (5 if exact else 6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("waiting", ["parked", "held"])
@pytest.mark.gated()
def test_network_loss_to_redis_from_one_node_for_10_seconds(own_redis: RedisServer, redis_proxy: TcpProxy,
                                                            make_harness: MakeHarness, waiting: str) -> None:
    """Broker and admission backend on a Redis of its own; node ``cut`` reaches it through a
    TCP proxy that loses every packet for 10 s (connections are not reset: TCP would keep
    retransmitting), node ``direct`` does not. Cap 2, 30 tasks of 0.3 s. Every task completes,
    the cap holds (the loss is shorter than instance_ttl, 15 s, so the cut node's slots stay
    its own), duplicates are counted. Twice: with waiters parked (lingering off, at least 5
    rows parked before the loss) and with lingering on, the default (worker/linger.py: some
    waiters wait unacked in a prefetch window, up to 0.5 s, instead of being parked)."""
    # The servers are fixtures asked for before make_harness: the workers stop before them.
    conf = {"flowcontrol_queues": [{"name": "n", "concurrency": 2, "retry": 0.5}],
            "flowcontrol_backend_url": own_redis.url, "flowcontrol_instance_ttl": 15.0,
            "flowcontrol_grant_ttl": 5.0, **(PARKING if waiting == "parked" else {})}
    h = make_harness(ChaosHarness, conf=conf, broker=own_redis.url)
    cut_conf = {**h.conf, "flowcontrol_backend_url": redis_proxy.url}
    h.start_worker(2, name="cut", env={"FCT_BROKER_URL": redis_proxy.url, "FCT_CONF": json.dumps(cut_conf),
                                      "FCT_TRACE": "1"})
    h.start_worker(2, name="direct", env={"FCT_TRACE": "1"})
    labels = h.submit("n", 30, 0.3)
    enough = 5 if waiting == "parked" else 0
    wait_for(lambda: h.parked("n") >= enough and len(h.gauge.done()) >= 4, 30, what="a run in progress")
    cut_at, done_during = down_for(h, 10, redis_proxy.lose, redis_proxy.heal)
    wait_all(h, labels, ["n"], timeout=75)
    runs = h.gauge.executions()
    during = sum(1 for r in runs if cut_at <= r.start <= cut_at + 10)
    out = verdict(f"network-loss-10s ({waiting})", h, labels, 2,
                  extra=f"{during} started during the loss (cut node: "
                        f"{sum(1 for r in runs if r.node == 'cut' and cut_at <= r.start <= cut_at + 10)}), "
                        f"{done_during} done by its end")
    assert not out["missing"] and out["peak"] <= 2
