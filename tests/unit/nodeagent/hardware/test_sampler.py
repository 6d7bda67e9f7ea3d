"""The sampler: bounded history, statuses, isolation of failing sources, its thread."""

from __future__ import annotations

import pathlib
import threading
import time
from typing import Any

import pytest

from collscope.nodeagent import errors, hardware
from collscope.nodeagent.hardware import gpu, rdma, source

S = 1_000_000_000


class Clock:
    def __init__(self, t: int = 1_732_001_234 * S) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


class Counting(source.Source):
    """A source giving one reading whose value counts its samples."""

    def __init__(self, name: str = "counting", *, fail: Exception | None = None) -> None:
        super().__init__()
        self.name = name
        self.fail = fail
        self.n = 0
        self.closed = False

    def sample(self, now_ns: int) -> list[source.Reading]:
        if self.fail is not None:
            raise self.fail
        self.n += 1
        return [source.Reading("dev0", "count", float(self.n))]

    def close(self) -> None:
        self.closed = True


def test_records_are_bundle_hw_records() -> None:
    clock = Clock()
    sampler = hardware.Sampler([Counting()], node="node-7", clock_ns=clock)
    (rec,) = sampler.sample_once()
    assert rec.type == "hw"
    assert (rec.node, rec.device, rec.metric, rec.value, rec.ts) == (
        "node-7",
        "dev0",
        "count",
        1.0,
        clock.t,
    )
    assert sampler.latest() == [rec]


def test_history_is_bounded_by_time_and_windows_are_inclusive() -> None:
    clock = Clock()
    sampler = hardware.Sampler([Counting()], node="n", history_s=10, clock_ns=clock)
    t0 = clock.t
    for _ in range(30):
        sampler.sample_once()
        clock.t += S
    everything = sampler.window(0, 2**63 - 1)
    assert [r.value for r in everything] == [float(v) for v in range(20, 31)], "last 10 s"
    window = sampler.window(t0 + 22 * S, t0 + 24 * S)
    assert [r.ts for r in window] == [t0 + 22 * S, t0 + 23 * S, t0 + 24 * S]
    assert sampler.window(t0 + 100 * S, t0 + 200 * S) == []


def test_one_failing_source_never_stops_the_others(tmp_path: pathlib.Path) -> None:
    good = Counting("good")
    bug = Counting("bug", fail=ZeroDivisionError("oops"))
    absent = rdma.RdmaSource(sys_root=tmp_path)
    broken = Counting("broken", fail=errors.HardwareReadError("netlink: link dump: ENOBUFS"))
    sampler = hardware.Sampler([bug, absent, broken, good], node="n", clock_ns=Clock())
    assert [r.metric for r in sampler.sample_once()] == ["count"]
    status = {s.name: s for s in sampler.statuses()}
    assert status["good"].available and status["good"].reason == ""
    assert not status["bug"].available
    assert status["bug"].reason == "internal error: ZeroDivisionError: oops"
    assert not status["rdma"].available and "class/infiniband" in status["rdma"].reason
    assert status["broken"].reason == "netlink: link dump: ENOBUFS"


def test_partial_source_is_available_with_its_warnings(fake_nvml: Any) -> None:
    import pynvml

    fake_nvml.gpus[0].fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_UNKNOWN
    sampler = hardware.Sampler([gpu.GpuSource(fake_nvml)], node="n", clock_ns=Clock())
    sampler.sample_once()
    (status,) = sampler.statuses()
    assert status.available
    assert status.reason == "gpu0: nvmlDeviceGetPowerUsage: Unknown Error"
    assert sampler.gpu_processes() == {101: 0, 102: 0, 201: 1}


def test_statuses_before_the_first_sample() -> None:
    sampler = hardware.Sampler([Counting()], node="n")
    assert sampler.statuses() == [
        hardware.SourceStatus(name="counting", available=False, reason="not sampled yet")
    ]
    assert sampler.latest() == []
    assert sampler.gpu_processes() == {}


def test_default_sources_on_this_machine(tmp_path: pathlib.Path) -> None:
    """The real sources, as the agent builds them; here there is no GPU and no RDMA."""
    sampler = hardware.Sampler(hardware.default_sources(sys_root=tmp_path), node="n")
    sampler.sample_once()
    status = {s.name: s for s in sampler.statuses()}
    assert set(status) == {"nvml", "netlink", "rdma"}
    assert status["netlink"].available, status["netlink"].reason  # every Linux has netlink
    assert not status["rdma"].available
    if not status["nvml"].available:
        assert status["nvml"].reason.startswith("NVML: ")
    sampler.stop()


def test_thread_samples_until_stopped() -> None:
    src = Counting()
    sampler = hardware.Sampler([src], node="n", interval_s=0.01)
    sampler.start()
    sampler.start()  # idempotent
    deadline = time.monotonic() + 5
    while src.n < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert src.n >= 5
    assert src.closed
    n = src.n
    time.sleep(0.05)
    assert src.n == n, "no sample after stop"
    assert not [t for t in threading.enumerate() if t.name == "collscope-hw"]


def test_readers_are_safe_while_sampling() -> None:
    clock_lock = threading.Lock()
    t = [1_732_001_234 * S]

    def clock() -> int:
        with clock_lock:
            t[0] += 1000
            return t[0]

    sampler = hardware.Sampler([Counting()], node="n", interval_s=0.0005, clock_ns=clock)
    sampler.start()
    try:
        for _ in range(200):
            window = sampler.window(0, 2**63 - 1)
            assert [r.ts for r in window] == sorted(r.ts for r in window)
            sampler.latest()
            sampler.statuses()
    finally:
        sampler.stop()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        hardware.Sampler([], node="n", interval_s=0)


def test_a_lasting_failure_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    broken = Counting("broken", fail=errors.HardwareReadError("netlink: link dump: ENOBUFS"))
    sampler = hardware.Sampler([broken], node="n", clock_ns=Clock())
    for _ in range(5):
        sampler.sample_once()
    assert [r.getMessage() for r in caplog.records] == [
        "hardware source broken: netlink: link dump: ENOBUFS"
    ]
    broken.fail = errors.HardwareReadError("netlink: link dump: EBUSY")
    sampler.sample_once()
    assert len(caplog.records) == 2
