"""The NVML source: the real bindings where no GPU exists, and pynvml's interface faked."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from collscope.nodeagent import errors
from collscope.nodeagent.hardware import gpu, source

T0 = 1_732_001_234_000_000_000


def values(readings: list[source.Reading]) -> dict[tuple[str, str], float]:
    return {(r.device, r.metric): r.value for r in readings}


def has_nvidia_driver() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(has_nvidia_driver(), reason="this machine has NVML; tests/gpu covers it")
def test_real_pynvml_without_driver_is_unavailable_with_the_reason() -> None:
    src = gpu.GpuSource()  # imports the real pynvml, whose nvmlInit fails here
    with pytest.raises(errors.HardwareUnavailable, match=r"^NVML: .*Not Found|^NVML: .*Driver"):
        src.sample(T0)
    assert src.gpu_processes() == {}
    src.close()  # closing a source that never opened is fine


def test_init_failure_is_unavailable_and_retried(nvml_kit: Any) -> None:
    nvml = nvml_kit.FakeNvml([nvml_kit.FakeGpu()], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    src = gpu.GpuSource(nvml)
    with pytest.raises(errors.HardwareUnavailable, match="Driver Not Loaded"):
        src.sample(T0)
    nvml.init_error = None  # the driver got loaded: the next sample opens NVML
    assert values(src.sample(T0))[("gpu0", "sm_clock_mhz")] == 1980


def test_the_max_sm_clock_is_sampled_beside_the_clock(nvml_kit: Any) -> None:
    """The profiled kernels' utilisation is SM clock / max SM clock (EROICA §4.2): a capped
    GPU reports its lower clock against an unchanged maximum."""
    capped = nvml_kit.FakeGpu(sm_clock_mhz=1200)
    v = values(gpu.GpuSource(nvml_kit.FakeNvml([capped])).sample(T0))
    assert (v[("gpu0", "sm_clock_mhz")], v[("gpu0", "sm_clock_max_mhz")]) == (1200, 1980)


def test_a_stand_in_without_the_max_clock_still_samples(nvml_kit: Any) -> None:
    class Older(nvml_kit.FakeNvml):  # type: ignore[misc]
        nvmlDeviceGetMaxClockInfo = None  # noqa: N815 (pynvml's name)

    v = values(gpu.GpuSource(Older([nvml_kit.FakeGpu()])).sample(T0))
    assert v[("gpu0", "sm_clock_mhz")] == 1980 and ("gpu0", "sm_clock_max_mhz") not in v


def test_no_gpu_is_unavailable(nvml_kit: Any) -> None:
    nvml = nvml_kit.FakeNvml([])
    with pytest.raises(errors.HardwareUnavailable, match="no GPU"):
        gpu.GpuSource(nvml).sample(T0)
    assert nvml.initialised == 0, "NVML must be shut down again"


def test_every_metric_with_units(fake_nvml: Any) -> None:
    g = fake_nvml.gpus[1]
    g.clocks_event_reasons = 0x4
    g.pcie_gen = 3
    g.ecc_corrected, g.ecc_uncorrected = 12, 1
    v = values(gpu.GpuSource(fake_nvml).sample(T0))
    assert v[("gpu1", "sm_clock_mhz")] == 1980
    assert v[("gpu1", "gpu_utilization_percent")] == 97
    assert v[("gpu1", "memory_utilization_percent")] == 40
    assert v[("gpu1", "power_watts")] == pytest.approx(650.0)
    assert v[("gpu1", "temperature_celsius")] == 61
    assert v[("gpu1", "clocks_event_reasons")] == 0x4
    assert v[("gpu1", "pcie_tx_bytes_per_second")] == 1000 * 1024
    assert v[("gpu1", "pcie_rx_bytes_per_second")] == 2000 * 1024
    assert v[("gpu1", "pcie_link_gen")] == 3
    assert v[("gpu0", "pcie_link_gen")] == 5
    assert v[("gpu1", "pcie_link_gen_max")] == 5
    assert v[("gpu1", "pcie_link_width")] == 16
    assert v[("gpu1", "ecc_corrected_errors_total")] == 12
    assert v[("gpu1", "ecc_uncorrected_errors_total")] == 1
    assert v[("gpu1", "gpu_lost")] == 0
    assert v[("gpu1", "xid_events_total")] == 0


def test_nvlink_totals_and_rates(fake_nvml: Any) -> None:
    src = gpu.GpuSource(fake_nvml)
    fake_nvml.gpus[0].nvlink_tx_kib = 1000
    first = values(src.sample(T0))
    assert first[("gpu0", "nvlink_tx_bytes_total")] == 1000 * 1024
    assert ("gpu0", "nvlink_tx_bytes_per_second") not in first, "no rate from one sample"
    fake_nvml.gpus[0].nvlink_tx_kib = 1000 + 2 * 1024 * 1024  # +2 GiB in 0.5 s
    second = values(src.sample(T0 + 500_000_000))
    assert second[("gpu0", "nvlink_tx_bytes_per_second")] == pytest.approx(4 * 2**30)
    assert second[("gpu0", "nvlink_rx_bytes_per_second")] == 0


def test_unsupported_counters_are_left_out_and_not_asked_again(nvml_kit: Any) -> None:
    board = nvml_kit.FakeGpu(nvlink_tx_kib=None, nvlink_rx_kib=None, ecc_corrected=None)
    board.ecc_uncorrected = None
    board.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml = nvml_kit.FakeNvml([board])
    src = gpu.GpuSource(nvml)
    v = values(src.sample(T0))
    assert not {m for _, m in v if m.startswith(("nvlink", "ecc", "power"))}
    assert v[("gpu0", "sm_clock_mhz")] == 1980
    assert src.warnings == [], "unsupported is not a problem to report"
    nvml.calls.clear()
    src.sample(T0 + 1)
    assert "nvmlDeviceGetPowerUsage" not in nvml.calls
    assert nvml.calls.count("nvmlDeviceGetTotalEccErrors") == 0


def test_other_errors_leave_one_counter_out_with_a_warning(fake_nvml: Any) -> None:
    fake_nvml.gpus[0].fail["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    src = gpu.GpuSource(fake_nvml)
    v = values(src.sample(T0))
    assert ("gpu0", "temperature_celsius") not in v
    assert ("gpu1", "temperature_celsius") in v
    assert ("gpu0", "power_watts") in v
    assert src.warnings == ["gpu0: nvmlDeviceGetTemperature: Unknown Error"]
    del fake_nvml.gpus[0].fail["nvmlDeviceGetTemperature"]
    assert ("gpu0", "temperature_celsius") in values(src.sample(T0 + 1)), "asked again"


def test_lost_gpu_is_evidence_and_the_others_are_read(fake_nvml: Any) -> None:
    src = gpu.GpuSource(fake_nvml)
    src.sample(T0)
    fake_nvml.gpus[0].lost = True
    v = values(src.sample(T0 + 1))
    assert v[("gpu0", "gpu_lost")] == 1
    assert [m for d, m in v if d == "gpu0"] == ["gpu_lost"]
    assert v[("gpu1", "gpu_lost")] == 0
    assert src.gpu_processes() == {201: 1}


def test_xid_events_drained_without_blocking(fake_nvml: Any) -> None:
    src = gpu.GpuSource(fake_nvml)
    src.sample(T0)
    fake_nvml.gpus[1].xids += [79, 48]
    readings = src.sample(T0 + 1)
    assert [r.value for r in readings if r.metric == "xid"] == [79, 48]
    assert {r.device for r in readings if r.metric == "xid"} == {"gpu1"}
    v = values(readings)
    assert v[("gpu1", "xid_events_total")] == 2
    assert v[("gpu0", "xid_events_total")] == 0
    assert not [r for r in src.sample(T0 + 2) if r.metric == "xid"], "each event once"


def test_xid_storm_is_bounded_per_sample(fake_nvml: Any) -> None:
    src = gpu.GpuSource(fake_nvml)
    fake_nvml.gpus[0].xids += [13] * (gpu.MAX_XID_PER_SAMPLE + 5)
    assert sum(r.metric == "xid" for r in src.sample(T0)) == gpu.MAX_XID_PER_SAMPLE
    assert sum(r.metric == "xid" for r in src.sample(T0 + 1)) == 5


def test_processes_map_pids_to_gpus(fake_nvml: Any) -> None:
    src = gpu.GpuSource(fake_nvml)
    assert src.gpu_processes() == {}
    src.sample(T0)
    assert src.gpu_processes() == {101: 0, 102: 0, 201: 1}


def test_close_shuts_nvml_down_and_reopens(fake_nvml: Any) -> None:
    src = gpu.GpuSource(fake_nvml)
    src.sample(T0)
    assert fake_nvml.initialised == 1
    src.close()
    assert fake_nvml.initialised == 0
    src.sample(T0 + 1)
    assert fake_nvml.initialised == 1


def test_old_driver_throttle_reasons_name(nvml_kit: Any) -> None:
    class OldNvml(nvml_kit.FakeNvml):  # type: ignore[misc]
        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:  # noqa: N802
            return 0x8

    nvml = OldNvml([nvml_kit.FakeGpu()])
    # A pre-535 pynvml has only the "Throttle" name of the call.
    nvml.nvmlDeviceGetCurrentClocksEventReasons = None
    assert values(gpu.GpuSource(nvml).sample(T0))[("gpu0", "clocks_event_reasons")] == 0x8
