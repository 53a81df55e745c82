"""``beat_schedule(app)`` takes its periods from the app's settings, as docs/settings.md says."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_flowcontrol import beat_schedule
from celery_flowcontrol.errors import FlowControlConfigError


def periods(schedule: dict) -> dict[str, tuple[float, float]]:
    return {name: (entry["schedule"], entry["options"]["expires"]) for name, entry in schedule.items()}


def test_without_an_app_the_defaults() -> None:
    assert periods(beat_schedule()) == {"flowcontrol.reclaim": (15.0, 15.0),
                                        "flowcontrol.wake_due": (5.0, 5.0)}


def test_the_intervals_come_from_the_apps_settings() -> None:
    app = Celery("proj", set_as_current=False)
    app.conf.update(flowcontrol_reclaim_interval="1m", flowcontrol_wake_due_interval=10)
    schedule = beat_schedule(app)
    assert periods(schedule) == {"flowcontrol.reclaim": (60.0, 60.0),
                                 "flowcontrol.wake_due": (10.0, 10.0)}
    assert {e["task"] for e in schedule.values()} == {"flowcontrol.reclaim", "flowcontrol.wake_due"}
    # A keyword wins over the setting; the other still comes from the app.
    assert periods(beat_schedule(app, wake_due_every=2)) == {"flowcontrol.reclaim": (60.0, 60.0),
                                                             "flowcontrol.wake_due": (2.0, 2.0)}


def test_settings_are_read_afresh_at_each_call() -> None:
    app = Celery("proj", set_as_current=False)
    assert periods(beat_schedule(app))["flowcontrol.wake_due"] == (5.0, 5.0)
    app.conf.flowcontrol_wake_due_interval = 30
    assert periods(beat_schedule(app))["flowcontrol.wake_due"] == (30.0, 30.0)


def test_under_a_celery_namespace_and_merged_into_the_apps_schedule() -> None:
    app = Celery("proj", set_as_current=False)
    app.config_from_object({"CELERY_FLOWCONTROL_RECLAIM_INTERVAL": 45}, namespace="CELERY")
    app.conf.beat_schedule = {"mine": {"task": "proj.mine", "schedule": 3600}}
    app.conf.beat_schedule = {**app.conf.beat_schedule, **beat_schedule(app)}
    assert set(app.conf.beat_schedule) == {"mine", "flowcontrol.reclaim", "flowcontrol.wake_due"}
    assert app.conf.beat_schedule["flowcontrol.reclaim"]["schedule"] == 45.0


def test_a_bad_interval_names_the_setting() -> None:
    app = Celery("proj", set_as_current=False)
    app.conf.flowcontrol_wake_due_interval = "soon"
    with pytest.raises(FlowControlConfigError, match="flowcontrol_wake_due_interval"):
        beat_schedule(app)


def test_the_former_positional_periods_still_work_and_warn() -> None:
    with pytest.warns(DeprecationWarning, match="app first"):
        schedule = beat_schedule(30, 3)
    assert periods(schedule) == {"flowcontrol.reclaim": (30.0, 30.0),
                                 "flowcontrol.wake_due": (3.0, 3.0)}
    with pytest.raises(TypeError, match="keywords"):
        beat_schedule(Celery("x", set_as_current=False), 3)
