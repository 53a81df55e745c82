"""Settings are checked in every process that calls ``FlowControl(app)`` (a producer too), named
as the configuration spells them; a ``flow_queue`` no configured queue names is reported at
publish as ``flowcontrol_unknown_queues`` says."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import Celery

from celery_flowcontrol import FlowControl, FlowTask
from celery_flowcontrol.errors import FlowControlConfigError

QUEUES = [{"name": "emails", "concurrency": 2}, {"name": "reports", "concurrency": 1}]


def producer(namespace: str | None = None, **conf: Any) -> Celery:
    """A web process's app: memory broker, no worker."""
    app = Celery("web", broker="memory://", set_as_current=False)
    if namespace:
        app.config_from_object(conf, namespace=namespace)
    else:
        app.conf.update(conf)
    return app


def test_a_typo_fails_at_flowcontrol_app_when_the_config_is_loaded() -> None:
    app = producer(flowcontrol_queue=QUEUES)
    app.conf.broker_url  # noqa: B018 - the configuration is loaded, as after a first read
    with pytest.raises(FlowControlConfigError) as err:
        FlowControl(app)
    assert err.value.field == "flowcontrol_queue"
    assert "did you mean 'flowcontrol_queues'?" in str(err.value)


def test_before_the_config_is_loaded_it_fails_where_celery_loads_it() -> None:
    app = producer(flowcontrol_queue=QUEUES, flowcontrol_backend_url="memory://")
    FlowControl(app)  # may come before config_from_object: nothing is read yet

    @app.task(base=FlowTask, flow_queue="emails", shared=False)
    def send_email() -> None: ...

    with pytest.raises(FlowControlConfigError, match="did you mean 'flowcontrol_queues'"):
        send_email.delay()  # the first send loads the configuration: nothing is sent
    # And every later send of a flow task says it again, instead of sending ungated.
    with pytest.raises(FlowControlConfigError, match="flowcontrol_queue"):
        send_email.delay()


def test_flowcontrol_app_may_still_come_before_config_from_object() -> None:
    app = Celery("web", broker="memory://", set_as_current=False)
    FlowControl(app)
    app.config_from_object({"flowcontrol_queues": QUEUES})
    assert [q.name for q in FlowControl(app).settings.queues] == ["emails", "reports"]


@pytest.mark.parametrize(("conf", "namespace", "field", "hint"), [
    ({"CELERY_FLOWCONTROL_QUEUE": QUEUES}, "CELERY", "CELERY_FLOWCONTROL_QUEUE",
     "did you mean 'CELERY_FLOWCONTROL_QUEUES'?"),
    ({"FLOWCONTROL_QUEUE": QUEUES}, None, "FLOWCONTROL_QUEUE", "did you mean 'FLOWCONTROL_QUEUES'?"),
    ({"flowcontrol_queue": QUEUES}, None, "flowcontrol_queue", "did you mean 'flowcontrol_queues'?"),
    ({"CELERY_FLOWCONTROL_GRANT_TTL": "soon"}, "CELERY", "CELERY_FLOWCONTROL_GRANT_TTL", "'soon'"),
    ({"CELERY_FLOWCONTROL_POLL_INTERVAL": 5, "CELERY_FLOWCONTROL_GRANT_TTL": 5}, "CELERY",
     "CELERY_FLOWCONTROL_POLL_INTERVAL", "shorter than CELERY_FLOWCONTROL_GRANT_TTL (5 s)"),
    ({"CELERY_FLOWCONTROL_QUEUES": ["emails"]}, "CELERY", "CELERY_FLOWCONTROL_QUEUES[0]", "got 'emails'"),
    ({"CELERY_FLOWCONTROL_UNKNOWN_QUEUES": "loud"}, "CELERY", "CELERY_FLOWCONTROL_UNKNOWN_QUEUES",
     "'warn', 'error', 'ignore'"),
], ids=["namespace-typo", "upper-typo", "lower-typo", "namespace-value", "namespace-relation",
        "namespace-entry", "namespace-policy"])
def test_errors_name_the_setting_as_written(conf: dict[str, Any], namespace: str | None,
                                             field: str, hint: str) -> None:
    app = producer(namespace, **conf)
    app.conf.broker_url  # noqa: B018 - loaded: FlowControl(app) checks at once
    with pytest.raises(FlowControlConfigError) as err:
        FlowControl(app)
    assert err.value.field == field and hint in str(err.value)
    assert str(err.value).startswith(f"field {field!r}: ")


def test_a_parking_url_of_a_dialect_sqlalchemy_lacks_fails_in_a_producer_too() -> None:
    app = producer(flowcontrol_parking_url="postgres://app@db/app")
    app.conf.broker_url  # noqa: B018
    with pytest.raises(FlowControlConfigError, match="did you mean postgresql\\+psycopg://") as err:
        FlowControl(app)
    assert err.value.field == "flowcontrol_parking_url"


# -- a flow_queue that names no configured queue ------------------------------------------------


def tasks(app: Celery) -> Any:
    @app.task(base=FlowTask, flow_queue="emial", shared=False)
    def typo() -> None: ...

    @app.task(base=FlowTask, flow_queue="emails", shared=False)
    def right() -> None: ...

    return typo, right


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and "names no queue" in r.getMessage()]


def test_an_unknown_flow_queue_is_a_warning_once_per_name(caplog: pytest.LogCaptureFixture) -> None:
    app = producer(flowcontrol_queues=QUEUES)
    FlowControl(app)
    typo, right = tasks(app)
    with caplog.at_level(logging.WARNING, logger="celery_flowcontrol"):
        typo.delay()
        typo.delay()
        right.delay()
        right.apply_async(flow_queue="reprots")
    said = warnings_of(caplog)
    assert len(said) == 2, said
    assert f"task {typo.name!r}: flow_queue 'emial' names no queue of flowcontrol_queues " \
           "(did you mean 'emails'?)" in said[0]
    assert "'reprots'" in said[1] and "did you mean 'reports'?" in said[1]


def test_unknown_queues_error_refuses_to_send_naming_task_and_queue() -> None:
    app = producer(flowcontrol_queues=QUEUES, flowcontrol_unknown_queues="error")
    FlowControl(app)
    typo, right = tasks(app)
    for _ in range(2):  # every time, not once
        with pytest.raises(FlowControlConfigError) as err:
            typo.delay()
        assert err.value.queue == "emial" and err.value.field == "flow_queue"
        assert typo.name in str(err.value)
    right.delay()  # a configured queue sends


def test_unknown_queues_ignore_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    app = producer(flowcontrol_queues=QUEUES, flowcontrol_unknown_queues="ignore")
    typo, _ = tasks(app)
    with caplog.at_level(logging.WARNING, logger="celery_flowcontrol"):
        typo.delay()
    assert warnings_of(caplog) == []


def test_known_at_run_time_or_unknowable_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    app = producer(flowcontrol_queues=QUEUES, flowcontrol_unknown_queues="error")
    typo, _ = tasks(app)
    FlowControl(app).register_queue({"name": "emial", "concurrency": 1})  # the backend knows it
    typo.delay()
    bare = producer()  # configures no queue: the producer can't know them, and says nothing
    bare_typo, _ = tasks(bare)
    with caplog.at_level(logging.WARNING, logger="celery_flowcontrol"):
        bare_typo.delay()
    assert warnings_of(caplog) == []


def test_serial_tasks_need_no_configured_queue(caplog: pytest.LogCaptureFixture) -> None:
    app = producer(flowcontrol_queues=QUEUES, flowcontrol_unknown_queues="error")

    @app.task(base=FlowTask, serial=True, shared=False)
    def one_at_a_time() -> None: ...

    one_at_a_time.delay()
