"""flow_cost and callable fairness keys at publish.

A cost or key is a number/text per call or a decorator default, or a callable
``(args, kwargs)`` evaluated at publish; bad input is refused there, naming the task, the
queue and the field, and nothing is sent. A cost above what a ``per="cost"`` limit of the
queue admits at once is refused too. Runs on kombu's in-process ``memory://`` transport;
``before_task_publish`` shows what goes on the wire.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, signals

from celery_flowcontrol import FlowControl, FlowTask, QueueConfig
from celery_flowcontrol.errors import CostRefusedError, FlowControlError, InvalidTicketError
from celery_flowcontrol.protocol import read_options

LLM = QueueConfig("llm", rate_limit=["500/m", {"limit": 200_000, "period": "1m", "per": "cost"}],
                  per_key_rate_limit={"limit": 50_000, "period": 60, "algorithm": "gcra",
                                      "burst": 20_000, "per": "cost"})


TOKENS = QueueConfig("tok", rate_limit=["500/m", {"limit": 200_000, "period": "1m", "per": "cost"}])


@pytest.fixture
def sent() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def grab(sender: Any = None, headers: Any = None, **kw: Any) -> None:
        seen.append({"task": sender, "headers": headers if headers is not None else {}})

    signals.before_task_publish.connect(grab, weak=False)
    yield seen
    signals.before_task_publish.disconnect(grab)


@pytest.fixture
def app() -> Celery:
    app = Celery("cost", broker="memory://", set_as_current=False)
    app.conf.flowcontrol_queues = [LLM, TOKENS]
    FlowControl(app)
    return app


def tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    return len(kwargs["prompt"]) * 10


def test_a_callable_cost_and_key_are_evaluated_at_publish(app: Celery, sent: list) -> None:
    @app.task(base=FlowTask, flow_queue="llm", flow_cost=tokens, shared=False,
              fairness_key=lambda args, kwargs: kwargs["tenant"])
    def complete(prompt: str, tenant: str) -> str:
        return prompt

    complete.apply_async(kwargs={"prompt": "hello", "tenant": "acme"})
    complete.apply_async(kwargs={"prompt": "hi", "tenant": "acme"}, flow_cost=1200,
                         fairness_key=lambda args, kwargs: "globex")
    complete.apply_async(kwargs={"prompt": "x", "tenant": "t"}, flow_cost=lambda a, k: 2.5)
    h = [s["headers"] for s in sent]
    assert [(x["flow_cost"], x["flow_fairness_key"]) for x in h] == [(50, "acme"), (1200, "globex"),
                                                            (2.5, "t")]
    opts = read_options(h[0], complete)
    assert opts is not None and (opts.cost, opts.key) == (50.0, "acme")


def test_a_number_default_travels_by_name_too(app: Celery, sent: list) -> None:
    @app.task(base=FlowTask, flow_queue="llm", flow_cost=300, name="cost.fixed", shared=False)
    def fixed() -> None: ...

    fixed.delay()
    app.send_task("cost.fixed")
    assert [s["headers"]["flow_cost"] for s in sent] == [300, 300]


def test_without_a_cost_the_message_carries_none_and_admission_charges_one(
        app: Celery, sent: list) -> None:
    @app.task(base=FlowTask, flow_queue="llm", shared=False)
    def plain() -> None: ...

    plain.delay()
    assert "flow_cost" not in sent[0]["headers"]
    opts = read_options(sent[0]["headers"], plain)
    assert opts is not None and opts.cost == 1


def raises(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    raise KeyError("prompt")


BAD = [
    pytest.param({"flow_cost": 0}, CostRefusedError, "flow_cost", "got 0", id="zero"),
    pytest.param({"flow_cost": -5}, CostRefusedError, "flow_cost", "got -5", id="negative"),
    pytest.param({"flow_cost": math.nan}, CostRefusedError, "flow_cost", "nan", id="nan"),
    pytest.param({"flow_cost": math.inf}, CostRefusedError, "flow_cost", "inf", id="inf"),
    pytest.param({"flow_cost": "100"}, CostRefusedError, "flow_cost", "'100'", id="text"),
    pytest.param({"flow_cost": True}, CostRefusedError, "flow_cost", "True", id="bool"),
    pytest.param({"flow_cost": lambda a, k: None}, CostRefusedError, "flow_cost", "None",
                 id="callable-returns-none"),
    pytest.param({"flow_cost": raises}, InvalidTicketError, "flow_cost",
                 "callable raised KeyError", id="callable-raises"),
    pytest.param({"flow_cost": 200_001}, CostRefusedError, "flow_cost",
                 "admits at once (20000): it can never run", id="above-every-limit"),
    pytest.param({"flow_cost": 20_001}, CostRefusedError, "flow_cost", "burst 20000",
                 id="above-a-key-windows-burst"),
    pytest.param({"fairness_key": lambda a, k: 42}, InvalidTicketError, "fairness_key",
                 "got int '42'", id="key-not-text"),
    pytest.param({"fairness_key": raises}, InvalidTicketError, "fairness_key",
                 "callable raised KeyError", id="key-raises"),
]


@pytest.mark.parametrize(("options", "error", "field", "detail"), BAD)
def test_bad_input_is_refused_at_publish_and_nothing_is_sent(
        app: Celery, sent: list, options: dict[str, Any], error: type[FlowControlError],
        field: str, detail: str) -> None:
    @app.task(base=FlowTask, flow_queue="llm", name="cost.call", shared=False)
    def call(prompt: str = "") -> None: ...

    with pytest.raises(error) as info:
        call.apply_async(kwargs={"prompt": "p"}, **options)
    exc = info.value
    assert (exc.queue, exc.field) == ("llm", field)  # type: ignore[attr-defined]
    assert "'cost.call'" in str(exc) and detail in str(exc)
    assert sent == [], "nothing was sent"


def test_the_refusal_names_the_limit(app: Celery, sent: list) -> None:
    @app.task(base=FlowTask, flow_queue="tok", name="cost.tok", shared=False)
    def tok() -> None: ...

    with pytest.raises(CostRefusedError, match=r"limit 200000 per 60 s \(per cost, fixed\)"):
        tok.apply_async(flow_cost=200_001)
    tok.apply_async(flow_cost=200_000)
    assert [x["headers"]["flow_cost"] for x in sent] == [200_000]


def test_a_bad_decorator_default_is_refused_at_each_publish(app: Celery, sent: list) -> None:
    @app.task(base=FlowTask, flow_queue="llm", flow_cost=raises, name="cost.broken",
              fairness_key=lambda a, k: None, shared=False)
    def broken() -> None: ...

    with pytest.raises(InvalidTicketError, match="fairness_key"):
        broken.delay()
    assert sent == []


def test_a_queue_this_process_does_not_know_takes_any_valid_cost(app: Celery, sent: list) -> None:
    """The worker knows the queue; the producer can't judge its limits (nor reach a backend
    that does not know the queue): the cost goes as it is."""
    @app.task(base=FlowTask, flow_queue="elsewhere", shared=False)
    def far() -> None: ...

    far.apply_async(flow_cost=10**9)
    assert sent[0]["headers"]["flow_cost"] == 10**9


@pytest.mark.parametrize("value", ["12", None, -1, 0, math.inf, [], True])
def test_a_garbage_cost_header_reads_as_nan_for_admission_to_refuse(value: Any) -> None:
    class Task:
        name, flow_queue, flow_cost = "t", "llm", None

    opts = read_options({"flow_queue": "llm", "flow_cost": value, "id": "x"}, Task)
    assert opts is not None
    if value is None:
        assert opts.cost == 1
    else:
        assert math.isnan(opts.cost)
