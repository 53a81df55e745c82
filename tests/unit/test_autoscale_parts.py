"""The autoscaler's parts that need no worker: settings, gauges, the children's pipe, drops, stats."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from celery.exceptions import Retry, SoftTimeLimitExceeded, WorkerLostError
from celery.worker import state as worker_state

from celery_flowcontrol.autoscale import AdaptiveAutoscaler, is_drop
from celery_flowcontrol.autoscaling.gauges import CpuGauge, cgroup_memory, host_memory, memory_percent, rss_bytes
from celery_flowcontrol.autoscaling.options import AutoscaleOptions
from celery_flowcontrol.autoscaling.recorder import PipeFeed, TickRecorder
from celery_flowcontrol.errors import FlowControlConfigError
from celery_flowcontrol.worker import control

GiB = 1 << 30


def test_options_defaults_follow_the_autoscale_flag() -> None:
    opts = AutoscaleOptions.from_value(None, cli_min=2, cli_max=16)
    assert (opts.min, opts.max, opts.tick, opts.ram_ceiling_pct, opts.cpu_ceiling_pct) == (2, 16, 2.0, 85.0, None)
    assert AutoscaleOptions.from_value({"max": 8, "tick": "500ms"}, 1, 32).max == 8


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ({"min": 0}, "flowcontrol_autoscale.min", "between 1"),
        ({"min": 9, "max": 4}, "flowcontrol_autoscale.min", "<= max"),
        ({"start": 40}, "flowcontrol_autoscale.start", "between min"),
        ({"tick": 0}, "flowcontrol_autoscale.tick", "duration"),
        ({"ram_ceiling_pct": 120}, "flowcontrol_autoscale.ram_ceiling_pct", "percentage"),
        ({"cpu_ceiling_pct": True}, "flowcontrol_autoscale.cpu_ceiling_pct", "percentage"),
        ({"tolerance": 0.9}, "flowcontrol_autoscale.tolerance", "between 1"),
        ({"drop_exceptions": "OSError"}, "flowcontrol_autoscale.drop_exceptions", "list"),
        ({"ram_gauge": "no.such.module:gauge"}, "flowcontrol_autoscale.ram_gauge", "cannot import"),
        ({"tik": 1}, "flowcontrol_autoscale", "did you mean 'tick'"),
        ([1, 32], "flowcontrol_autoscale", "must be a dict"),
    ],
)
def test_bad_options_name_the_field(value: object, field: str, words: str) -> None:
    with pytest.raises(FlowControlConfigError) as info:
        AutoscaleOptions.from_value(value, 1, 32)
    assert info.value.field == field and words in str(info.value) and field in str(info.value)


def test_gauge_may_be_a_dotted_path() -> None:
    opts = AutoscaleOptions.from_value({"ram_gauge": "os:getpid"}, 1, 4)
    assert opts.ram_gauge is os.getpid


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_memory_reads_cgroup_v2_and_takes_the_tighter_limit(tmp_path: Path) -> None:
    write(tmp_path, "proc/meminfo", f"MemTotal: {16 * GiB // 1024} kB\nMemAvailable: {12 * GiB // 1024} kB\n")
    write(tmp_path, "sys/fs/cgroup/memory.max", f"{2 * GiB}\n")
    write(tmp_path, "sys/fs/cgroup/memory.current", f"{GiB + GiB // 2}\n")
    write(tmp_path, "sys/fs/cgroup/memory.stat", f"anon 1\ninactive_file {GiB // 2}\n")
    assert host_memory(str(tmp_path)) == (16 * GiB, 4 * GiB)
    assert cgroup_memory(str(tmp_path)) == (2 * GiB, GiB)
    assert memory_percent(str(tmp_path)) == 50.0  # cgroup 50% beats host 25%


def test_memory_reads_cgroup_v1_and_ignores_unlimited(tmp_path: Path) -> None:
    write(tmp_path, "proc/meminfo", f"MemTotal: {8 * GiB // 1024} kB\nMemAvailable: {2 * GiB // 1024} kB\n")
    write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    assert cgroup_memory(str(tmp_path)) is None
    assert memory_percent(str(tmp_path)) == 75.0
    write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", f"{4 * GiB}\n")
    write(tmp_path, "sys/fs/cgroup/memory/memory.usage_in_bytes", f"{3 * GiB}\n")
    write(tmp_path, "sys/fs/cgroup/memory/memory.stat", f"total_inactive_file {GiB}\n")
    assert memory_percent(str(tmp_path)) == 75.0 and cgroup_memory(str(tmp_path)) == (4 * GiB, 2 * GiB)
    write(tmp_path, "sys/fs/cgroup/memory.max", "max\n")  # a v2 file wins over v1 and says unlimited
    assert cgroup_memory(str(tmp_path)) is None


def test_host_memory_finds_its_two_fields_anywhere_in_meminfo(tmp_path: Path) -> None:
    """Found by name, not by line: any order, no trailing newline, look-alike names ignored,
    MemFree when the kernel is too old for MemAvailable, None when MemTotal is missing."""
    write(tmp_path, "proc/meminfo", f"Buffers: 1 kB\nMemAvailable: {GiB // 1024} kB\nHugeMemTotal: 1 kB\n"
                                    f"MemTotal: {4 * GiB // 1024} kB")  # fmt: skip
    assert host_memory(str(tmp_path)) == (4 * GiB, 3 * GiB)
    write(tmp_path, "proc/meminfo", f"MemTotal: {4 * GiB // 1024} kB\nMemFree: {2 * GiB // 1024} kB\n")
    assert host_memory(str(tmp_path)) == (4 * GiB, 2 * GiB)
    write(tmp_path, "proc/meminfo", f"MemFree: {2 * GiB // 1024} kB\n")
    assert host_memory(str(tmp_path)) is None
    write(tmp_path, "proc/meminfo", "MemTotal:\nMemFree: 1 kB\n")  # a field with no value
    assert host_memory(str(tmp_path)) is None


def test_gauges_on_a_machine_without_proc(tmp_path: Path) -> None:
    assert memory_percent(str(tmp_path)) is None
    assert CpuGauge(str(tmp_path)).read() is None
    assert rss_bytes([1, 2], str(tmp_path)) == 0


def test_cpu_gauge_and_rss_on_this_machine() -> None:
    gauge = CpuGauge()
    sum(i * i for i in range(200_000))
    value = gauge.read()
    assert value is None or 0.0 <= value <= 100.0
    assert rss_bytes([os.getpid()]) > 1 << 20


def test_recorder_turns_a_tick_into_a_sample() -> None:
    now = [0.0]
    rec = TickRecorder(clock=lambda: now[0])
    for latency in (0.05, 0.05, 0.10):
        rec.record(latency)
    rec.record(1.0, dropped=True)
    now[0] = 2.0
    sample = rec.sample(inflight=3, stalled=1, ram_pct=40.0)
    assert sample.latencies == (0.05, 0.05, 0.10) and sample.drops == 1 and sample.stalled == 1
    assert sample.busy == pytest.approx(1.2 / 2.0)  # Little's law: task-seconds / tick
    assert rec.completed == 3 and rec.dropped == 1 and rec.throughput == 1.5
    now[0] = 3.0
    assert rec.sample(inflight=2).busy == 2.0  # nothing finished: in flight is the only figure


def test_drop_burst_triggers_an_early_tick() -> None:
    rec = TickRecorder()
    for _ in range(7):
        rec.record(0.001, dropped=True)
    assert not rec.drop_burst(8, 0.05)
    rec.record(0.001, dropped=True)
    assert rec.drop_burst(8, 0.05)
    rec.sample(inflight=0)
    assert not rec.drop_burst(8, 0.05)


def test_pipe_feed_carries_records_from_a_forked_child() -> None:
    feed, rec = PipeFeed(), TickRecorder()
    pid = os.fork()
    if pid == 0:  # the child: what a prefork pool process does in task_postrun
        for i in range(500):
            feed.send(i / 1000, i % 10 == 0)
        os._exit(0)
    os.waitpid(pid, 0)
    assert feed.drain(rec) == 500
    sample = rec.sample(inflight=0)
    assert len(sample.latencies) == 450 and sample.drops == 50
    feed.close()


@pytest.mark.parametrize(
    ("exc", "extra", "expected"),
    [
        (ConnectionRefusedError(), (), True),
        (TimeoutError(), (), True),
        (SoftTimeLimitExceeded(), (), True),
        (WorkerLostError(), (), True),
        (ValueError("bad input"), (), False),
        (KeyError("x"), ("LookupError",), True),  # matched along the MRO
        (KeyError("x"), ("builtins.KeyError",), True),
        (Retry(exc=ConnectionResetError()), (), True),  # a retry after an infra error
        (None, (), False),
    ],
)
def test_is_drop(exc: BaseException | None, extra: tuple[str, ...], expected: bool) -> None:
    assert is_drop(exc, extra) is expected


def test_stats_registry_collects_every_provider_and_isolates_failures() -> None:
    control.register_stats_provider("admission", lambda state: {"held": 2, "parked": 5, "woken": 1})
    control.register_stats_provider("broken", lambda state: 1 / 0)
    try:
        reply = control.collect(state=None)
        assert reply["admission"] == {"held": 2, "parked": 5, "woken": 1}
        assert reply["broken"]["error"].startswith("ZeroDivisionError")
        assert reply["autoscaler"] is None  # no worker, no autoscaler
    finally:
        control.unregister_stats_provider("admission")
        control.unregister_stats_provider("broken")
    assert set(control.stats_providers()) == {"autoscaler"}
    with pytest.raises(TypeError):
        control.register_stats_provider("x", "not callable")  # type: ignore[arg-type]


class GreenPool:
    """What the autoscaler uses of Celery's gevent/eventlet TaskPool."""

    is_green = True

    def __init__(self, limit: int) -> None:
        self.limit = limit

    @property
    def num_processes(self) -> int:
        return self.limit

    def grow(self, n: int = 1) -> None:
        self.limit += n

    def shrink(self, n: int = 1) -> None:
        self.limit -= n

    def maintain_pool(self) -> None:
        pass


class Req:
    """A stand-in for a Request in Celery's (weak) sets of reserved and active requests."""

    time_start = None  # not started long ago: no stall


def test_green_pool_under_a_backlog_grows_though_arrivals_find_free_slots() -> None:
    # A green worker's consumer blocks in pool.spawn while the pool is full, so it fetches the
    # next message only once a slot opened; equal tasks started together end together. After each
    # batch the held message starts and the next ones arrive one by one: each finds a free slot
    # but the last. Only 1 in `limit` arrivals "found every slot taken" (0.5 at 2 slots), though
    # the slots are busy nearly all the time: judged by that share, the pool would stick at 2
    # ("not enough to probe"), so green pools judge demand by the busy figure.
    pool = GreenPool(8)
    scaler = AdaptiveAutoscaler(pool, 8, 1)
    scaler.controller.ram_ceiling_pct = None  # this machine's RAM is not what is tested
    now = [0.0]
    scaler.recorder = TickRecorder(clock=lambda: now[0])
    kept: list[Req] = []
    try:
        limits = []
        for _ in range(5):
            limit = scaler.controller.limit
            for _batch in range(10):  # one 0.5 s tick of 50 ms tasks
                for arrived in range(1, limit + 1):
                    worker_state.reserved_requests.clear()
                    kept[:] = [Req() for _ in range(arrived + 1)]  # `arrived` running, plus this one
                    worker_state.reserved_requests.update(kept)
                    scaler.on_task_received(kept[-1])
                for _task in range(limit):
                    scaler.recorder.record(0.048)
            worker_state.active_requests.update(kept[:limit])
            now[0] += 0.5
            scaler.tick()
            worker_state.active_requests.clear()
            limits.append(scaler.controller.limit)
        assert limits == [2, 3, 4, 5, 6], scaler.controller.last
        assert pool.limit == 6
    finally:
        scaler.stop()
        worker_state.reserved_requests.clear()
        worker_state.active_requests.clear()


def test_no_decision_once_the_worker_is_shutting_down(monkeypatch: pytest.MonkeyPatch) -> None:
    # After a warm shutdown the consumer takes nothing more: an empty pool then is no idle sign.
    scaler = AdaptiveAutoscaler(GreenPool(3), 8, 3)
    scaler.controller.ram_ceiling_pct = None
    try:
        monkeypatch.setattr(worker_state, "should_stop", 0)  # EX_OK: falsy, yet set
        scaler._last_tick -= 60
        scaler.maybe_scale()
        assert scaler.controller.last is None
        monkeypatch.setattr(worker_state, "should_stop", None)
        scaler.maybe_scale()
        assert scaler.controller.last is not None
    finally:
        scaler.stop()


def test_overhead_counts_deciding_only_and_is_never_negative() -> None:
    # A resize (forking children) inside a tick must not be subtracted from a CPU total that
    # does not hold that tick yet, or the event's overhead reads negative after a fork.
    pool = GreenPool(1)

    def slow_grow(n: int = 1) -> None:
        started = time.thread_time()
        while time.thread_time() - started < 0.03:
            pass
        pool.limit += n

    pool.grow = slow_grow  # type: ignore[method-assign]
    scaler = AdaptiveAutoscaler(pool, 8, 1)
    scaler.controller.ram_ceiling_pct = None
    try:
        scaler.apply(3)  # as at start-up, or the remote autoscale command: outside a tick
        scaler._last_tick -= 60
        scaler.maybe_scale()
        scaler.controller.limit = 1
        scaler.apply(2)
        scaler.maybe_scale()
        figures = scaler.figures()
        assert figures["resize_pct"] > 0
        assert 0 <= figures["overhead_pct"] and scaler._cpu_spent < 0.03, figures
    finally:
        scaler.stop()
