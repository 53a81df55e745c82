"""The root of the tests: each test is marked after its folder, and the fixtures of
:mod:`tests.support.fixtures` are every tier's (the shared services, servers of a test's own,
the worker harness). tests/support/ holds everything tests share; no test module starts a
server, builds a message or a waker, or picks a free port by itself.

Tests are marked by folder: tests/unit -> `unit`, tests/contract -> `contract`, and so on.

The suite runs on three pytest-xdist workers (tox.ini's addopts: ``-n 3``; on two cores, since
most of a test's time is spent waiting on a lease, a TTL or a worker's boot), each test isolated
by its own key prefix, schema, broker queue and tmp dir. Two kinds of test stay on one worker
(:func:`work_unit`): the chaos scenarios and the autoscaler's, one after the other in one of
two lanes (:data:`LANES`), and the tests of a module whose module-scoped fixture is a server or
a browser (started once, not once per worker). The lanes are handed out first, one to each of
two workers, since they are the longest units; every other test fills in beside them. ``-n 0``
runs everything in one process (``-s`` then shows a chaos scenario's printout live).
"""

from __future__ import annotations

import functools
import logging
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import in_ci, postgres_url_setting, rabbitmq_url_setting, redis_url_setting

pytest_plugins = ("tests.support.fixtures",)

TEST_FOLDERS = ("unit", "contract", "integration", "e2e")
#: Tests that run one at a time (folders or modules, from tests/), in lanes: a lane's tests
#: run one after the other on one xdist worker, the two lanes side by side. A test goes to the
#: first lane that names it. What never runs beside what, and why:
#:
#: * the two heaviest fleets, the soak (3 nodes taking ~30 tasks/s for 2 minutes) and the
#:   crash storm (nodes killed and started again for 40 s), never beside each other: the
#:   drains and bounds of each assume a machine that keeps up with its load;
#: * the autoscaler's tests beside neither: the autoscaler grows a pool only while the
#:   machine answers its probes in time (a neighbour's load is what it must back off from);
#: * no two chaos scenarios of one lane at once. The scenarios of ``faults`` mostly wait (a
#:   lease, a TTL, a restart, a server down for 20 s): one beside another loads the machine
#:   about as much as one beside an e2e test, which is what the third worker runs anyway.
#:
#: ``fleets`` takes the service faults (test_services.py) too, so the lanes are of about one
#: length.
LANES = {
    "serial:fleets": ("chaos/test_soak.py", "chaos/test_crash_storm.py", "chaos/test_services.py",
                      "integration/test_autoscale_worker.py"),
    "serial:faults": ("chaos/",),
}
#: A fixture that lives as long as its module (or class): its tests share one xdist worker.
MODULE_SCOPE = re.compile(r"""@pytest\.fixture\([^)]*scope=["'](module|class|package)["']""")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test after its folder, so `-m unit` or `-m "not e2e"` select by kind."""
    tests_root = Path(__file__).parent
    for item in items:
        try:
            folder = item.path.relative_to(tests_root).parts[0]
        except ValueError:
            continue
        if folder in TEST_FOLDERS:
            item.add_marker(getattr(pytest.mark, folder))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Hand the tests to the xdist workers as :func:`work_unit` groups them: pytest-xdist's
    own ``xdist_group`` marks are lost on pytest 9 (it renames ``item._nodeid``, which pytest 9
    no longer reads), so the grouping is done here, from each test's node id."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):  # type: ignore[misc]
        lanes_first = False

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(config.rootpath, nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # The queue is complete before the first unit leaves it (xdist orders it by number
            # of tests): the lanes go first, so that each worker starts with one.
            if not self.lanes_first:
                self.workqueue = lanes_first(self.workqueue)
                self.lanes_first = True
            super()._assign_work_unit(node)

    return Scheduling(config, log)


def work_unit(root: Path, nodeid: str) -> str:
    """The unit a test is scheduled in: its lane (:data:`LANES`), its module for a test whose
    module defines a fixture of module (or class) scope, else the test alone."""
    path = nodeid.split("::", 1)[0]
    for lane, paths in LANES.items():
        if path.removeprefix("tests/").startswith(paths):
            return lane
    return path if has_module_scoped_fixture(root / path) else nodeid


@pytest.fixture(autouse=True)
def root_logging_given_back() -> Any:
    """The root logger as each test found it: a worker started in the test's own process
    (``celery.contrib.testing.worker.start_worker``) sets the root level to its log level
    (ERROR), which would hide every warning from the tests that run after it there."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    root.setLevel(level)
    root.handlers[:] = handlers


def lanes_first(queue: dict[str, Any]) -> OrderedDict[str, Any]:
    """The work queue with the lanes at its head (in :data:`LANES` order), the rest as it was."""
    head = [(lane, queue[lane]) for lane in LANES if lane in queue]
    return OrderedDict([*head, *((unit, tests) for unit, tests in queue.items() if unit not in LANES)])


@functools.cache
def has_module_scoped_fixture(path: Path) -> bool:
    """True when the module at *path* defines a fixture set up once per module or class."""
    try:
        return MODULE_SCOPE.search(path.read_text()) is not None
    except OSError:
        return False


def pytest_report_header(config: pytest.Config) -> str:
    """Say where the services are expected, and whether a missing one fails or skips."""
    mode = "fail" if in_ci() else "skip"
    return (
        f"flowcontrol services: redis={redis_url_setting()} postgres={postgres_url_setting()} "
        f"rabbitmq={rabbitmq_url_setting()}; unreachable -> {mode}"
    )
