"""Real prefork workers on a real Redis Cluster (3 masters, 3 replicas) by URL alone.

``flowcontrol_backend_url = "redis+cluster://..."`` and nothing else: the workers build their
own cluster client. Three flow queues are picked so that their hash slots are owned by three
different masters (CLUSTER KEYSLOT, CLUSTER SLOTS); waiters are parked (lingering off) with
a re-check 60 s away, so every one that runs before then was woken by a grant, and the
test process, which releases nothing, hears the grants on the cluster's pub/sub.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_flowcontrol.admission import Grant, backend_from_url
from tests.support.fixtures import MakeHarness
from tests.support.harness import max_overlap, wait_for
from tests.support.topology import ReplicatedCluster

CAPS = {"a": 2, "b": 3, "c": 1}
TASKS = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedCluster]:
    c = ReplicatedCluster(Path(tmp_path_factory.mktemp("cluster6"))).start()
    try:
        yield c
    finally:
        c.stop()


def spread(cluster: ReplicatedCluster, prefix: str, n: int) -> list[str]:
    """*n* queue names whose keys live on *n* different masters."""
    names: dict[int, str] = {}
    for i in range(500):
        name = f"q{i}"
        names.setdefault(cluster.master_of(f"{prefix}:{{{name}}}:cfg"), name)
        if len(names) == n:
            return list(names.values())
    raise AssertionError("no spread of queue names over the masters")


@pytest.mark.timeout(120)
@pytest.mark.gated()
def test_caps_exact_on_a_cluster_queues_on_three_masters_grants_by_cluster_pubsub(
        make_harness: MakeHarness, cluster: ReplicatedCluster, key_prefix: str) -> None:
    names = spread(cluster, key_prefix, 3)
    queues = dict(zip(names, CAPS.values(), strict=True))
    masters = {cluster.master_of(f"{key_prefix}:{{{q}}}:cfg") for q in queues}
    slots = {cluster.keyslot(f"{key_prefix}:{{{q}}}:slots") for q in queues}
    assert len(masters) == 3 and len(slots) == 3, (masters, slots)
    conf = {"flowcontrol_backend_url": cluster.url, "flowcontrol_linger": 0,
            "flowcontrol_queues": [{"name": q, "concurrency": cap, "retry": 60}
                                   for q, cap in queues.items()]}
    h = make_harness(conf=conf)

    heard: list[Grant] = []
    lock = threading.Lock()
    watcher = backend_from_url(cluster.url, key_prefix=key_prefix)

    def hear(grant: Grant) -> None:
        with lock:
            heard.append(grant)

    subscription = watcher.subscribe_grants(hear)
    try:
        h.start_worker(3, name="w1")
        h.start_worker(3, name="w2")
        labels = {q: [f"{q}-{i}" for i in range(TASKS)] for q in queues}
        for q, ls in labels.items():
            for label in ls:
                h.send("work", label, 0.05, flow_queue=q)
        everything = [label for ls in labels.values() for label in ls]
        done = h.wait_done(everything, timeout=50)  # < retry: woken by grants, not re-checks
        wait_for(lambda: all(watcher.stats(q).in_use == 0 for q in queues), 10,
                 what="every slot free again")
    finally:
        subscription.close()
        watcher.close()
    runs = h.gauge.executions()
    peaks = {q: max_overlap([r for r in runs if r.label.startswith(f"{q}-")]) for q in queues}
    by_queue = {q: sum(1 for g in heard if g.queue == q) for q in queues}
    print(f"\ncluster: masters {sorted(masters)}, slots {sorted(slots)}, peaks {peaks} "
          f"(caps {queues}), grants heard by the test process {by_queue}")
    assert set(done.values()) == {1} and len(done) == len(everything), "each task ran once"
    assert all(peaks[q] <= cap for q, cap in queues.items()), (peaks, queues)
    assert peaks[names[1]] >= 2, "the cap-3 queue never ran tasks side by side"
    assert all(n > 0 for n in by_queue.values()), by_queue
    assert h.parked() == 0
