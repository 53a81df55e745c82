"""``python -m benchmarks``: what its command line takes."""

from __future__ import annotations

import pytest

from benchmarks import __main__ as runner


def test_an_unknown_name_stops_the_run_before_any_benchmark(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    monkeypatch.setattr(runner, "run_one", ran.append)
    assert runner.main(["flood", "nosuch"]) == 2
    assert ran == []
    assert "no such benchmark: nosuch" in capsys.readouterr().err


def test_quick_is_taken_as_the_profile_it_already_is(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def run_one(name: str) -> bool:
        ran.append(name)
        return True

    monkeypatch.setattr(runner, "run_one", run_one)
    monkeypatch.setattr("benchmarks.report.install", lambda: None)
    monkeypatch.setattr("benchmarks.report.write", lambda: "(not written)")
    assert runner.main(["--quick", "why"]) == 0
    assert ran == ["why"]
