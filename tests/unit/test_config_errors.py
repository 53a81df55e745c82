"""The error hierarchy: one root, structured fields, and errors that survive Celery result backends."""

from __future__ import annotations

import pickle

import celery
import pytest
from celery.backends.base import BaseBackend
from celery.utils.serialization import UnpickleableExceptionWrapper, create_exception_cls

from celery_flowcontrol import errors
from celery_flowcontrol.errors import (
    BackendUnavailableError,
    FlowControlConfigError,
    FlowControlError,
    InvalidTicketError,
    MissingDependencyError,
    ParkingUnavailableError,
    SlotTimeoutError,
    UnknownQueueError,
)

EXAMPLES = [
    pytest.param(
        FlowControlConfigError("must be an int between 1 and 100000, got 0", "emails", "concurrency"),
        {"queue": "emails", "field": "concurrency"},
        "flow queue 'emails': field 'concurrency': must be an int between 1 and 100000, got 0",
        id="config",
    ),
    pytest.param(
        FlowControlConfigError("must be a duration, got -1", field="flowcontrol_grant_ttl"),
        {"queue": None, "field": "flowcontrol_grant_ttl"},
        "field 'flowcontrol_grant_ttl': must be a duration, got -1",
        id="config-setting",
    ),
    pytest.param(
        InvalidTicketError("must be an int, got '3'", "emails", "flow_priority"),
        {"queue": "emails", "field": "flow_priority"},
        "flow queue 'emails': field 'flow_priority': must be an int, got '3'",
        id="ticket",
    ),
    pytest.param(
        UnknownQueueError("nope"), {"queue": "nope"}, "flow queue 'nope': is not registered", id="unknown"
    ),
    pytest.param(
        SlotTimeoutError("emails", 2.5),
        {"queue": "emails", "timeout": 2.5},
        "flow queue 'emails': no slot was granted within 2.5 s",
        id="slot-timeout",
    ),
    pytest.param(
        MissingDependencyError("redis", "redis"),
        {"extra": "redis", "module": "redis"},
        "the 'redis' module is not installed: pip install 'celery-flowcontrol[redis]'",
        id="missing-dependency",
    ),
    pytest.param(BackendUnavailableError("redis down"), {}, "redis down", id="backend-unavailable"),
    pytest.param(ParkingUnavailableError("db down"), {}, "db down", id="parking-unavailable"),
]


@pytest.mark.parametrize(("exc", "attrs", "message"), EXAMPLES)
def test_error_message_fields_and_pickle(exc: FlowControlError, attrs: dict, message: str) -> None:
    assert isinstance(exc, FlowControlError)
    assert str(exc) == message
    copy = pickle.loads(pickle.dumps(exc))
    assert type(copy) is type(exc) and str(copy) == message
    for name, value in attrs.items():
        assert getattr(exc, name) == value == getattr(copy, name)


@pytest.mark.parametrize(("exc", "attrs", "message"), EXAMPLES)
def test_error_survives_celery_json_result_backend(exc: FlowControlError, attrs: dict, message: str) -> None:
    backend = BaseBackend(celery.Celery("t", set_as_current=False), serializer="json")
    wire = backend.decode(backend.encode(backend.prepare_exception(exc)))
    rebuilt = backend.exception_to_python(wire)
    assert type(rebuilt) is type(exc) and str(rebuilt) == message
    for name, value in attrs.items():
        assert getattr(rebuilt, name) == value


def test_every_public_error_subclasses_the_root() -> None:
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), FlowControlError)
    assert issubclass(FlowControlConfigError, ValueError) and issubclass(InvalidTicketError, ValueError)
    assert issubclass(MissingDependencyError, ImportError)
    assert not issubclass(InvalidTicketError, FlowControlConfigError)


class SlotTimeoutErrorCopy(Exception):
    """Stands for SlotTimeoutError from another copy of the module (another install, a reload)."""

    def __init__(self, queue: str, timeout: float | None = None) -> None:
        super().__init__(queue, timeout)
        self.queue = queue


SlotTimeoutErrorCopy.__name__ = "SlotTimeoutError"


class QueueBusy(SlotTimeoutError):
    """A user's subclass: matched through its base class's name."""


def _celery_rebuilt_without_our_module() -> BaseException:
    """What a caller gets back when celery_flowcontrol.errors is not imported in its process."""
    backend = BaseBackend(celery.Celery("t", set_as_current=False), serializer="json")
    wire = backend.decode(backend.encode(backend.prepare_exception(SlotTimeoutError("emails", 1.0))))
    wire["exc_module"] = "celery_flowcontrol_not_imported_here"
    return backend.exception_to_python(wire)


def test_celery_rebuilds_a_dynamic_class_when_the_module_is_not_loaded() -> None:
    rebuilt = _celery_rebuilt_without_our_module()
    assert type(rebuilt).__name__ == "SlotTimeoutError" and not isinstance(rebuilt, SlotTimeoutError)
    assert SlotTimeoutError.is_(rebuilt)


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(SlotTimeoutError("emails", 1.0), id="ours"),
        pytest.param(pickle.loads(pickle.dumps(SlotTimeoutError("emails"))), id="pickled"),
        pytest.param(SlotTimeoutErrorCopy("emails"), id="module-copy"),
        pytest.param(QueueBusy("emails"), id="subclass"),
        pytest.param(
            create_exception_cls("SlotTimeoutError", "celery.exceptions")("emails", 1.0), id="dynamic"
        ),
        pytest.param(
            UnpickleableExceptionWrapper("celery_flowcontrol.errors", "SlotTimeoutError", ("emails", 1.0)),
            id="unpickleable-wrapper",
        ),
    ],
)
def test_is_matches_slot_timeouts_by_class_name(exc: BaseException) -> None:
    assert SlotTimeoutError.is_(exc)


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(None, id="none"),
        pytest.param(TimeoutError("emails"), id="other-class"),
        pytest.param(UnknownQueueError("emails"), id="other-flowcontrol-error"),
        pytest.param(create_exception_cls("SlotTimeoutError", "x")(), id="same-name-no-queue"),
        pytest.param(create_exception_cls("SlotTimeoutError", "x")(42), id="same-name-non-str-queue"),
        pytest.param(UnpickleableExceptionWrapper("m", "OtherError", ("emails",)), id="wrapper-other-class"),
    ],
)
def test_is_rejects_other_exceptions(exc: BaseException | None) -> None:
    assert not SlotTimeoutError.is_(exc)
