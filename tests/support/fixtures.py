"""The worker harness's fixtures (a plugin of tests/conftest.py, so the e2e and chaos tiers
share them): a :class:`~tests.support.harness.Harness` per test, logs on failure.

``make_harness(broker="redis"|"rabbitmq", parking="sqlite"|"postgres", conf={...})`` builds one
test's world on the shared service fixtures of tests/conftest.py. At teardown every process is
stopped and the test's broker queue and Redis keys are deleted; when the test failed, the tail of
every worker's and beat's log is printed (pytest shows it under "Captured stdout teardown").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import Harness

MakeHarness = Callable[..., Harness]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Keep each phase's report on the item, so teardown knows whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture
def make_harness(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, key_prefix: str
) -> Iterator[MakeHarness]:
    """A factory of harnesses (usually one per test), each closed at teardown."""
    made: list[Harness] = []

    def make(
        broker: str = "redis",
        parking: str = "sqlite",
        conf: dict[str, Any] | None = None,
        flow: bool = True,
        results: bool = False,
        backend: str = "redis",
    ) -> Harness:
        prefix = key_prefix if not made else f"{key_prefix}{len(made)}"
        broker_url = redis_url if broker == "redis" else request.getfixturevalue("rabbitmq_url")
        if parking == "postgres":
            from celery_flowcontrol.parking import migrate

            parking_url = request.getfixturevalue("postgres_url")
            migrate(parking_url)  # what `celery -A proj flowcontrol migrate` does before a deploy
        else:
            parking_url = f"sqlite:///{tmp_path / f'park-{prefix}.sqlite3'}"
        settings: dict[str, Any] = {
            "flowcontrol_backend_url": redis_url if backend == "redis" else "memory://",
            "flowcontrol_parking_url": parking_url,
            "flowcontrol_poll_interval": 0.2,
        }
        settings.update(conf or {})
        harness = Harness(
            workdir=tmp_path / prefix,
            broker_url=broker_url,
            gauge_url=redis_url,
            prefix=prefix,
            conf=settings,
            flow=flow,
            result_backend=redis_url if results else None,
        )
        made.append(harness)
        return harness

    yield make
    failed = any(getattr(getattr(request.node, f"rep_{w}", None), "failed", False) for w in ("setup", "call"))
    for harness in made:
        if failed:
            print(harness.logs())
        harness.close()
