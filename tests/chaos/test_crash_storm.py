"""A storm of crash-point kills on two nodes: a capped ordered queue, ETAs and a sliding window.

Two prefork nodes run with a crash point armed each (``FLOWCONTROL_CRASH_AT=<point>:<n>``,
drawn at random, seeded); traffic is sent in waves; each time a node dies at its point it is
started again with another. After the storm the nodes run unarmed until every task is done.
What must hold: nothing lost, the cap held (a run cut by a kill counts until its node died),
the window held on admission instants, and no node dying but at a crash point.
"""

from __future__ import annotations

import random
import time

import pytest

from celery_flowcontrol.worker.crashpoints import ENV, POINTS
from tests.support.fixtures import MakeHarness
from tests.support.gauge import Execution
from tests.support.harness import Node, max_in_window, max_overlap, wait_for
from tests.support.projects.chaos import PARKING, ChaosHarness, over_cap, wait_all

CAP = 2
WINDOW = 5  # admissions per second, sliding
STORM = 40.0  # seconds of kills
CONF = {"flowcontrol_queues": [
            {"name": "ord", "concurrency": CAP, "retry": 0.5},
            {"name": "win", "rate_limit": {"limit": WINDOW, "period": 1, "algorithm": "sliding"}}],
        "flowcontrol_instance_ttl": 3.0, "flowcontrol_reclaim_interval": 1.0,
        "flowcontrol_grant_ttl": 3.0, **PARKING}


def _wave(h: ChaosHarness, i: int) -> list[str]:
    """One wave: 6 capped tasks (2 with an ETA 1-2 s out) and 4 through the window."""
    labels = h.submit("ord", 4, 0.2, tag=f"o{i}-")
    labels += h.submit("ord", 2, 0.2, tag=f"e{i}-", countdown=1 + (i % 2))
    labels += h.submit("win", 4, 0.05, tag=f"w{i}-")
    return labels


def _clipped(execs: list[Execution], deaths: dict[str, float]) -> list[Execution]:
    """Each run cut by a kill ends when its node died (one that began between the node's
    stamp and its kill ends as it began)."""
    return [r if r.end is not None else Execution(r.exec_id, r.label, r.node, r.start,
                                                   max(r.start, deaths.get(r.node, float("inf"))))
            for r in execs]


@pytest.mark.timeout(240)
@pytest.mark.gated()
def test_a_storm_of_crash_point_kills_on_two_nodes(make_harness: MakeHarness) -> None:
    h = make_harness(ChaosHarness, broker="rabbitmq", conf=CONF)
    rng = random.Random(27)
    serial = 0
    deaths: dict[str, float] = {}  # node -> when it was killed at the storm's end (the gauge's clock)
    armed: dict[str, str] = {}
    kills = 0  # deaths at a crash point

    def start(armed_with: str | None) -> Node:
        nonlocal serial
        serial += 1
        name = f"n{serial}"
        env = {"FCT_NODE": name}
        if armed_with:
            env[ENV] = armed[name] = armed_with
        return h.start_worker(4, name=name, env=env, wait=False)

    def draw() -> str:
        return f"{rng.choice(POINTS)}:{rng.randint(1, 4)}"

    nodes = [start(draw()), start(draw())]
    for node in nodes:
        h.wait_ready(node)
    labels: list[str] = []
    began = time.monotonic()
    wave = 0
    while time.monotonic() - began < STORM:
        if wave < 12:
            labels += _wave(h, wave)
            wave += 1
        for i, node in enumerate(nodes):
            if not node.alive():
                kills += 1
                assert node.proc.returncode == -9, f"{node.name} exited by itself:\n{node.text()[-3000:]}"
                nodes[i] = start(draw())
        time.sleep(0.5)
    for i, node in enumerate(nodes):  # the storm ends: unarmed nodes drain what is left
        if node.name in armed:
            h.kill9(node)
            deaths[node.name] = h.gauge.server_time()
            nodes[i] = start(None)
    wait_all(h, labels, ["ord", "win"], timeout=120)
    wait_for(lambda: h.parked() == 0, 45, what="the parking table to empty")
    execs = [r for r in h.gauge.executions() if r.label in set(labels)]
    # A node killed at its crash point stamped the instant itself (the chaos project).
    capped = _clipped([r for r in execs if r.label[0] in "oe"], {**deaths, **h.gauge.deaths()})
    peak = max_overlap(capped)
    # One admission per (task, instant): a redelivered run that kept its slot keeps its instant.
    admitted = [float(instant) for label, instant in
                {tuple(raw.decode().split("|")) for raw in h.gauge.client.lrange(h.gauge.key("admitted"), 0, -1)}
                if label.startswith("w")]
    most, _ = max_in_window(admitted, 1.0)
    runs = h.gauge.runs()
    twice = sum(1 for label in labels if runs.get(label, 0) > 1)
    print(f"\nchaos crash storm: {len(labels)} tasks, {kills} kills at crash points "
          f"(armed: {', '.join(armed.values())}), {len(labels) - len(set(labels) - set(h.gauge.done()))} "
          f"completed, {twice} ran twice or more, peak {peak} (cap {CAP}), most admitted in 1 s "
          f"{most} (window {WINDOW})", flush=True)
    if peak > CAP:
        print(over_cap(capped, 0.0, None, CAP, h.ids), flush=True)
    assert not set(labels) - set(h.gauge.done())
    assert peak <= CAP and most <= WINDOW
    assert all(node.alive() for node in nodes)
    assert "Unrecoverable error" not in h.log_text()
    assert kills >= 3
