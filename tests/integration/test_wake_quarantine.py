"""A parked row that can't be published again is quarantined, and never delays any other row.

On a real Redis broker and a real RabbitMQ broker, with a real SQLite parking table: thirty
due rows are woken in one pass with poison rows planted among them (a TTL that is no number; on
RabbitMQ also a property the AMQP encoder refuses). Every good row is published, in one pass;
each poison row is in the dead-letter table with the reason and the error, out of its line in
the admission backend (so a grant made to it passes on), shown by ``celery flowcontrol dead``
and counted by the ``flowcontrol_dead_letters`` metric.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Queue

from celery_flowcontrol import FlowControl
from celery_flowcontrol.admission import MemoryBackend
from celery_flowcontrol.admission.base import Admitted, Ticket
from celery_flowcontrol.config import QueueConfig
from celery_flowcontrol.parking import ParkedMessage, ParkingStore
from celery_flowcontrol.views.dead import dead_rows
from celery_flowcontrol.worker.republish import WAKE_FAILED, wake_due
from tests.support.services import need_dashboard_module

POISON_AT = (4, 17)


@pytest.fixture(params=["redis", "amqp"])
def app(request: pytest.FixtureRequest, key_prefix: str, sqlite_url: str) -> Iterator[Celery]:
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "rabbitmq_url")
    app = Celery("quarantine", broker=url, set_as_current=False)
    app.conf.update(broker_transport_options={"global_keyprefix": f"{key_prefix}:"}
                    if request.param == "redis" else {},
                    flowcontrol_parking_url=sqlite_url, flowcontrol_key_prefix=key_prefix)
    app.conf.task_queues = [Queue(f"{key_prefix}.q", Exchange(f"{key_prefix}.q"), routing_key=f"{key_prefix}.q")]
    with app.connection_for_write() as conn:
        app.conf.task_queues[0](conn.default_channel).declare()
    yield app
    with app.connection_for_write() as conn:
        app.conf.task_queues[0](conn.default_channel).delete()


def row(app: Celery, i: int, **properties: Any) -> ParkedMessage:
    q = app.conf.task_queues[0]
    return ParkedMessage(task_id=f"t-{i:02d}", queue="api", body=b'[[], {}, {"callbacks": null}]',
                         wake_at=time.time() - 1, task_name="proj.t", headers={"id": f"t-{i:02d}", "task": "proj.t"},
                         properties={"delivery_mode": 2, **properties}, exchange=q.exchange.name,
                         routing_key=q.routing_key)  # fmt: skip


def drain(app: Celery) -> list[str]:
    q = app.conf.task_queues[0]
    ids = []
    with app.connection_for_write() as conn:
        bound = q(conn.default_channel)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(ids) < 30:
            message = bound.get(no_ack=True)
            if message is None:
                time.sleep(0.02)
                continue
            ids.append(message.headers["id"])
    return ids


def test_poison_rows_are_dead_lettered_and_the_rest_of_the_batch_is_woken(app: Celery) -> None:
    amqp = app.connection_for_write().transport.driver_type == "amqp"
    store = ParkingStore(app.conf.flowcontrol_parking_url)
    poison = {POISON_AT[0]: {"expiration": "never"}}
    if amqp:
        poison[POISON_AT[1]] = {"delivery_mode": "loud"}  # py-amqp can't encode it as an octet
    for i in range(30 + len(poison)):
        store.park(row(app, i, **poison.get(i, {})))
    # The first poison row waits in line for a slot: quarantined, it must leave the line.
    backend = MemoryBackend()
    backend.register(QueueConfig("api", concurrency=1))
    assert isinstance(backend.try_admit(Ticket("api", "holder", "w1")), Admitted)
    assert not isinstance(backend.try_admit(Ticket("api", f"t-{POISON_AT[0]:02d}", "w1")), Admitted)

    woken = wake_due(app, store, limit=200, backend=backend)

    good = [f"t-{i:02d}" for i in range(30 + len(poison)) if i not in poison]
    assert woken == 30
    assert sorted(drain(app)) == good
    assert store.count() == 0
    dead = {d.task_id: d for d in store.dead_letters()}
    assert sorted(dead) == sorted(f"t-{i:02d}" for i in poison)
    assert {d.reason for d in dead.values()} == {WAKE_FAILED}
    assert "expiration 'never'" in dead[f"t-{POISON_AT[0]:02d}"].error
    assert dead[f"t-{POISON_AT[0]:02d}"].message.properties["expiration"] == "never"  # kept as it was
    assert [w.task_id for w in backend.waiters("api")] == []

    fc = FlowControl(app)
    shown = dead_rows(fc, 10)
    assert {r.task_id for r in shown} == set(dead) and {r.reason for r in shown} == {WAKE_FAILED}
    need_dashboard_module("prometheus_client")
    from celery_flowcontrol.metrics import FlowControlCollector

    families = {f.name: f for f in FlowControlCollector(fc).collect()}
    samples = {s.labels["reason"]: s.value for s in families["flowcontrol_dead_letters"].samples}
    assert samples == {WAKE_FAILED: float(len(poison))}
    store.close()
