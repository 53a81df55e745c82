"""FlowTask puts its options into message headers; bad options are refused at the producer.

Runs on kombu's in-process ``memory://`` transport: publishing needs no server, and the
``before_task_publish`` signal shows exactly what goes on the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, signals

from celery_flowcontrol import FlowControl, FlowTask
from celery_flowcontrol.errors import InvalidTicketError


@pytest.fixture
def sent() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def grab(sender: Any = None, headers: Any = None, properties: Any = None, **kw: Any) -> None:
        # The very dict that is published, not a copy: this receiver is connected before the
        # test's FlowControl(app) connects its producer hook, which stamps the dict after us.
        seen.append({"task": sender, "headers": headers if headers is not None else {},
                     "priority": (properties or {}).get("priority")})

    signals.before_task_publish.connect(grab, weak=False)
    yield seen
    signals.before_task_publish.disconnect(grab)


def make_app(broker: str = "memory://") -> Celery:
    app = Celery("t", broker=broker, set_as_current=False)
    FlowControl(app)
    return app


def test_decorator_defaults_and_per_call_options_become_headers(sent: list) -> None:
    app = make_app()

    @app.task(base=FlowTask, flow_queue="api", flow_priority=2, fairness_key="acme", shared=False)
    def t(x: int) -> int:
        return x

    t.delay(1)
    t.apply_async((2,), flow_queue="other", flow_priority=9, fairness_key="globex")
    h1, h2 = sent[0]["headers"], sent[1]["headers"]
    assert (h1["flow_queue"], h1["flow_priority"], h1["flow_fairness_key"]) == ("api", 2, "acme")
    assert (h2["flow_queue"], h2["flow_priority"], h2["flow_fairness_key"]) == ("other", 9, "globex")


def test_signature_options_and_send_task_carry_flow_headers(sent: list) -> None:
    app = make_app()

    @app.task(base=FlowTask, flow_queue="api", shared=False)
    def t(x: int) -> int:
        return x

    t.s(1).set(flow_priority=4).apply_async()
    app.send_task(t.name, (2,))  # by name: the producer hook stamps the defaults
    app.send_task("elsewhere.task", (3,), headers={"flow_queue": "q", "flow_priority": 1})
    assert sent[0]["headers"]["flow_priority"] == 4
    assert sent[1]["headers"]["flow_queue"] == "api"
    assert sent[2]["headers"]["flow_queue"] == "q"


def test_a_key_under_the_deprecated_header_is_not_overridden_by_the_default(sent: list) -> None:
    """A message sent with ``flow_key`` (the fairness key's former header), by name or again by
    ``apply_async`` (a retry of such a message), keeps that key: the decorator default is not
    stamped beside it under the new name, where it would win."""
    app = make_app()

    @app.task(base=FlowTask, flow_queue="api", fairness_key="default", shared=False)
    def t() -> None: ...

    app.send_task(t.name, headers={"flow_key": "acme"})
    t.apply_async(headers={"flow_key": "acme"})
    for message in sent:
        assert message["headers"]["flow_key"] == "acme"
        assert "flow_fairness_key" not in message["headers"]


def test_flow_label_works_per_call_and_as_a_decorator_default(sent: list) -> None:
    """Like every flow option: a decorator default (text, or a callable evaluated at publish
    with the call's arguments), which a per-call value beats, and by name the text default."""
    from types import SimpleNamespace

    from celery_flowcontrol.protocol import read_options

    app = make_app()

    @app.task(base=FlowTask, flow_queue="api", shared=False,
              flow_label=lambda args, kwargs: f"report {args[0]}")
    def computed(n: int) -> None: ...

    @app.task(base=FlowTask, flow_queue="api", flow_label="nightly", shared=False)
    def fixed() -> None: ...

    computed.delay(7)
    computed.apply_async((8,), flow_label="by hand")
    app.send_task(fixed.name)
    assert [m["headers"].get("flow_label") for m in sent] == ["report 7", "by hand", "nightly"]
    opts = read_options({"id": "x", "flow_queue": "api"}, fixed)
    assert opts is not None and opts.label == "nightly"
    unlabelled = SimpleNamespace(name="t", flow_queue="api", flow_label=lambda a, k: "x")
    opts = read_options({"id": "x"}, unlabelled)
    assert opts is not None and opts.label == ""


def test_serial_works_per_call_and_as_a_decorator_default(sent: list) -> None:
    app = make_app()

    @app.task(base=FlowTask, serial=True, shared=False, name="proj.one_at_a_time")
    def serial_task() -> None: ...

    @app.task(base=FlowTask, shared=False, name="proj.sometimes")
    def plain() -> None: ...

    serial_task.delay()
    serial_task.apply_async(serial=False)
    plain.apply_async(serial=True)
    plain.delay()
    assert [m["headers"].get("flow_queue") for m in sent] == [
        "serial.proj.one_at_a_time", None, "serial.proj.sometimes", None]


def test_plain_tasks_get_no_flow_headers(sent: list) -> None:
    app = make_app()

    @app.task(base=FlowTask, shared=False, name="plain.unflowed")
    def t() -> None: ...

    t.delay()
    assert "flow_queue" not in sent[0]["headers"]


@pytest.mark.parametrize(("options", "field"), [
    ({"flow_priority": "high"}, "flow_priority"), ({"flow_priority": 1.5}, "flow_priority"),
    ({"flow_priority": 10**7}, "flow_priority"), ({"fairness_key": "k" * 257}, "fairness_key"),
    ({"fairness_key": 7}, "fairness_key"), ({"flow_queue": "Bad Name"}, "flow_queue"),
    ({"flow_queue": "a:b"}, "flow_queue"),
], ids=lambda v: str(v)[:30])
def test_bad_options_are_refused_before_anything_is_sent(sent: list, options: dict,
                                                          field: str) -> None:
    app = make_app()

    @app.task(base=FlowTask, flow_queue="api", shared=False)
    def t() -> None: ...

    with pytest.raises(InvalidTicketError) as err:
        t.apply_async(**options)
    assert err.value.field == field and field in str(err.value)
    assert sent == []


def test_a_flow_task_gets_the_broker_priority_a_plain_task_gets(sent: list) -> None:
    """flow_priority orders waiters in admission, not the broker: a FlowTask is published with
    the priority plain Celery gives it (none, or the task's own); real brokers'
    order: tests/integration/test_broker_priority.py."""
    app = make_app()

    @app.task(base=FlowTask, flow_queue="api", shared=False)
    def t() -> None: ...

    @app.task(base=FlowTask, flow_queue="api", priority=4, shared=False)
    def own() -> None: ...

    for options in ({}, {"flow_priority": 9}, {"flow_priority": -5}):
        t.apply_async(**options)
    own.apply_async(flow_priority=9)
    assert [s["priority"] for s in sent] == [None, None, None, 4]


def test_explicit_celery_priority_is_kept(sent: list) -> None:
    app = make_app("memory://")

    @app.task(base=FlowTask, flow_queue="api", shared=False)
    def t() -> None: ...

    t.apply_async(priority=3, flow_priority=9)
    assert sent[0]["priority"] == 3
