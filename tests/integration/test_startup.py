"""What a worker makes sure of at boot (worker/startup.py), on real services: the parking tables
on a PostgreSQL that lacks them and on the SQLite default, a parking URL of a wrong dialect, and
an admission backend on a Redis port where nothing listens (and one that comes up mid-retry)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_flowcontrol.engines import engines_of
from celery_flowcontrol.errors import BackendUnavailableError, FlowControlConfigError
from celery_flowcontrol.parking import migrate
from celery_flowcontrol.worker.startup import check_at_boot, connect_backend, wait_for_tables
from tests.support.services import RedisServer, free_port


def app_with(**conf: Any) -> Celery:
    app = Celery("proj", broker="memory://", set_as_current=False)
    app.conf.update(conf)
    return app


def messages(caplog: pytest.LogCaptureFixture, level: int, part: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and part in r.getMessage()]


def test_missing_postgres_tables_are_said_once_with_the_command_and_waited_for(
        postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    engines = engines_of(app_with(flowcontrol_parking_url=postgres_url))
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:  # the operator runs the command while the worker waits
            migrate(postgres_url)

    with caplog.at_level(logging.INFO, logger="celery_flowcontrol"):
        wait_for_tables(engines, sleep=sleep, every=0.01)
    said = messages(caplog, logging.ERROR, "parking tables")
    assert len(said) == 1, said  # once, however long it waits
    assert "flowcontrol_parked, flowcontrol_dead, flowcontrol_woken) are missing" in said[0]
    assert "`celery -A proj flowcontrol migrate`" in said[0]
    assert "takes no message until they exist" in said[0]
    assert naps == [0.01] * 3
    assert messages(caplog, logging.WARNING, "the parking tables exist now")
    assert engines.store.missing_tables() == []
    engines.store.close()


def test_the_sqlite_default_creates_its_tables_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.chdir(tmp_path)
    engines = engines_of(app_with())  # sqlite:///flowcontrol.sqlite3, in the worker's directory
    with caplog.at_level(logging.INFO, logger="celery_flowcontrol"):
        wait_for_tables(engines, sleep=lambda s: pytest.fail("waited"))
    assert (tmp_path / "flowcontrol.sqlite3").exists()
    assert engines.store.missing_tables() == []
    assert not messages(caplog, logging.ERROR, "parking tables")
    engines.store.close()


@pytest.mark.parametrize(("url", "says"), [
    ("postgres://app@127.0.0.1/app", "did you mean postgresql+psycopg://"),
    ("postgresql+psycopg://app@127.0.0.1:port/app", "has an invalid port"),
])
def test_a_wrong_dialect_or_malformed_url_stops_the_boot_naming_the_setting(url: str, says: str) -> None:
    engines = engines_of(app_with(flowcontrol_parking_url=url))
    with pytest.raises(FlowControlConfigError) as err:
        check_at_boot(engines)  # at once: no retry, no sleep
    assert err.value.field == "flowcontrol_parking_url" and says in str(err.value)


def test_an_unreachable_backend_is_retried_with_backoff_then_stops_the_boot(
        caplog: pytest.LogCaptureFixture, sqlite_url: str) -> None:
    port = free_port()  # nothing listens here
    engines = engines_of(app_with(flowcontrol_backend_url=f"redis://127.0.0.1:{port}/0",
                                  flowcontrol_parking_url=sqlite_url,
                                  flowcontrol_backend_connection_max_retries=3))
    naps: list[float] = []
    with caplog.at_level(logging.INFO, logger="celery_flowcontrol"), \
            pytest.raises(BackendUnavailableError) as err:
        connect_backend(engines, sleep=naps.append)
    assert naps == [2.0, 4.0, 6.0]  # as Celery's broker connection at startup: 2 s more each time
    assert "after 3 retries (flowcontrol_backend_connection_max_retries)" in str(err.value)
    said = messages(caplog, logging.ERROR, "unreachable at startup")
    assert [s.rsplit("(", 1)[1] for s in said] == ["1/3)", "2/3)", "3/3)"]  # one line a retry
    assert f"127.0.0.1:{port}" in said[0] and "trying again in 2.00 seconds" in said[0]


def test_a_backend_that_comes_up_mid_retry_lets_the_boot_go_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, sqlite_url: str) -> None:
    server = RedisServer(tmp_path / "late-redis")  # its port is free: nothing listens yet
    engines = engines_of(app_with(flowcontrol_backend_url=server.url,
                                  flowcontrol_parking_url=sqlite_url))
    naps: list[float] = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            server.start()

    try:
        with caplog.at_level(logging.INFO, logger="celery_flowcontrol"):
            check_at_boot_backend = connect_backend(engines, sleep=sleep)
        assert check_at_boot_backend is None and naps == [2.0, 4.0]
        assert len(messages(caplog, logging.ERROR, "unreachable at startup")) == 2
        assert messages(caplog, logging.WARNING, "answers again")
        assert engines.backend.queues() == []
    finally:
        engines.backend.close()
        engines.store.close()
        server.stop()
