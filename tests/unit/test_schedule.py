"""How tests/conftest.py hands the tests to the xdist workers: what runs in a lane, one test
after the other, and what goes first."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from tests.conftest import LANES, lanes_first, work_unit

ROOT = Path(__file__).resolve().parents[2]


def test_every_chaos_scenario_and_the_autoscalers_tests_run_in_a_lane() -> None:
    modules = [*sorted((ROOT / "tests" / "chaos").glob("test_*.py")),
               ROOT / "tests" / "integration" / "test_autoscale_worker.py"]
    for module in modules:
        assert work_unit(ROOT, f"{module.relative_to(ROOT).as_posix()}::test_x") in LANES, module


def test_the_two_heaviest_fleets_and_the_autoscaler_never_run_side_by_side() -> None:
    paths = ("chaos/test_soak.py", "chaos/test_crash_storm.py", "integration/test_autoscale_worker.py")
    assert len({work_unit(ROOT, f"tests/{path}::test_x") for path in paths}) == 1


def test_a_module_scoped_server_keeps_its_module_on_one_worker_and_other_tests_go_alone() -> None:
    module = "tests/contract/test_redis_contract.py"
    assert work_unit(ROOT, f"{module}::test_x[a]") == module
    assert work_unit(ROOT, "tests/unit/test_config.py::test_x[a]") == "tests/unit/test_config.py::test_x[a]"


def test_the_lanes_go_first_and_the_rest_keeps_its_order() -> None:
    queue = OrderedDict([("tests/contract/m.py", {}), ("serial:faults", {}), ("tests/unit/m.py::t", {}),
                         ("serial:fleets", {})])
    assert list(lanes_first(queue)) == [*LANES, "tests/contract/m.py", "tests/unit/m.py::t"]
