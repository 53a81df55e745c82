"""The pytest plugin (celery_flowcontrol.pytest) as a user loads it: a project of its own in a
temporary directory, with a conftest that names the plugin, run by a separate pytest process.

Twice: with pytest-celery installed and its plugin (``celery``: pytest-celery 1.x, which
re-exports ``celery.contrib.pytest``) loaded, as it is here by its entry point; and with that
plugin disabled (``-p no:celery``), as for a user without pytest-celery. The tests inside are
the user's: the example of docs/testing.md verbatim, a concurrency cap, a countdown moved by
the test's clock, and ``task_always_eager`` bypassing flow control.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TASKS = '''
import threading
import time

from celery import shared_task

from celery_flowcontrol import FlowTask


@shared_task(base=FlowTask, flow_queue="api")
def call_api(i):
    return i


@shared_task(base=FlowTask, flow_queue="one")
def slow(i):
    time.sleep(0.3)
    return i


# The in-thread worker runs tasks in this process: a test can hold one running.
GO = threading.Event()


@shared_task(base=FlowTask, flow_queue="one")
def held():
    assert GO.wait(20)
    return "done"
'''

CONFTEST = '''
import pytest

pytest_plugins = ["celery_flowcontrol.pytest"]


def pytest_report_header(config):
    celery = config.pluginmanager.get_plugin("celery")
    return f"celery plugin: {getattr(celery, '__name__', None)}"


@pytest.fixture
def celery_config():
    return {"flowcontrol_queues": [{"name": "api", "rate_limit": "2/m"},
                                   {"name": "one", "concurrency": 1}]}
'''

# docs/testing.md's example, as it is there.
EXAMPLE = '''
from tasks import call_api


def test_the_third_call_waits_a_minute(flowcontrol_app, flowcontrol, flowcontrol_worker):
    results = [call_api.delay(i) for i in range(3)]       # flow queue "api": 2/m
    assert [r.get(timeout=10) for r in results[:2]] == [0, 1]
    assert flowcontrol.parked("api") == 1
    flowcontrol.advance(61)
    flowcontrol.wake_due()
    assert results[2].get(timeout=10) == 2
'''

MORE = '''
import time

from celery import current_app

from tasks import GO, call_api, held, slow


def test_shared_tasks_bind_to_the_app(flowcontrol_app):
    assert current_app._get_current_object() is flowcontrol_app
    assert call_api.app is flowcontrol_app or call_api._get_current_object().app is flowcontrol_app
    assert flowcontrol_app.conf.broker_url == "memory://"


def test_a_concurrency_cap_parks_the_rest(flowcontrol, flowcontrol_worker):
    results = [slow.delay(i) for i in range(3)]        # flow queue "one": 1 at once
    assert flowcontrol.busy("one") + flowcontrol.parked("one") >= 2
    assert sorted(r.get(timeout=20) for r in results) == [0, 1, 2]
    assert flowcontrol.busy("one") == 0 and flowcontrol.parked("one") == 0


def test_a_running_task_keeps_its_slot_while_the_clock_moves(flowcontrol, flowcontrol_worker):
    first = held.delay()
    assert flowcontrol.busy("one") == 1
    flowcontrol.advance(300)  # ten instance lifetimes: the worker heartbeats through them
    second = slow.delay(1)
    assert flowcontrol.parked("one") == 1, "the cap still holds: the slot was not reclaimed"
    GO.set()
    assert first.get(timeout=10) == "done" and second.get(timeout=10) == 1


def test_a_countdown_runs_when_the_clock_says(flowcontrol, flowcontrol_worker):
    result = call_api.apply_async((7,), countdown=30)
    assert flowcontrol.parked("api") == 1, "a future ETA is parked until it is due"
    flowcontrol.advance(29)
    assert flowcontrol.wake_due() == 0 and not result.ready()
    flowcontrol.advance(1)
    assert flowcontrol.wake_due() == 1
    start = time.monotonic()
    assert result.get(timeout=10) == 7
    assert time.monotonic() - start < 5, "the worker's timer waits out the ETA by the test clock"


def test_advance_moves_only_forward(flowcontrol):
    now = flowcontrol.advance(0)
    assert flowcontrol.advance(1.5) == now + 1.5
    try:
        flowcontrol.advance(-1)
    except ValueError as exc:
        assert "seconds" in str(exc)
    else:
        raise AssertionError("a negative advance is refused")
'''

EAGER = '''
import pytest

from tasks import call_api


@pytest.fixture
def celery_config():
    return {"task_always_eager": True,
            "flowcontrol_queues": [{"name": "api", "rate_limit": "2/m"}]}


def test_eager_bypasses_flow_control(flowcontrol_app, flowcontrol):
    # As Celery bypasses its own rate_limit: each call runs at once, in the caller.
    assert [call_api.delay(i).get() for i in range(5)] == [0, 1, 2, 3, 4]
    assert flowcontrol.parked("api") == 0
    assert flowcontrol.busy("api") == 0
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(tasks=TASKS, test_example=EXAMPLE, test_more=MORE, test_eager=EAGER)
    pytester.makeconftest(CONFTEST)
    return pytester


def test_the_plugin_beside_pytest_celery(project: pytest.Pytester) -> None:
    """pytest-celery's plugin is loaded (its entry point: the test extra installs it) and
    shadows none of our fixtures."""
    result = project.runpytest_subprocess(timeout=240)
    result.stdout.fnmatch_lines(["celery plugin: pytest_celery.plugin"])
    result.assert_outcomes(passed=7)


def test_the_plugin_without_pytest_celery(project: pytest.Pytester) -> None:
    """Without pytest-celery's plugin (``-p no:celery``), nor celery.contrib.pytest: the
    example and the eager bypass, with the user's own celery_config fixture; the plugin
    loaded the other documented way, on the command line."""
    project.makeconftest(CONFTEST.replace('pytest_plugins = ["celery_flowcontrol.pytest"]', ""))
    result = project.runpytest_subprocess("-p", "no:celery", "-p", "celery_flowcontrol.pytest",
                                          "test_example.py", "test_eager.py", timeout=240)
    result.stdout.fnmatch_lines(["celery plugin: None"])
    result.assert_outcomes(passed=2)


def test_the_plugin_is_not_loaded_unless_asked(pytester: pytest.Pytester) -> None:
    """Installing the package adds no fixture to anyone's run."""
    pytester.makepyfile(test_none="def test_none(flowcontrol_app):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:celery", timeout=120)
    result.assert_outcomes(errors=1)
    assert "fixture 'flowcontrol_app' not found" in result.stdout.str()
