"""A fake NVML module with pynvml's interface, for machines without a GPU.

Only the ``nvml*`` functions are faked; constants, error classes and the ctypes structures the
functions return are pynvml's own (``NVMLError(code)`` maps to the same subclasses, field
values are real ``c_nvmlFieldValue_t``), so the source sees what the real bindings give it.
The real NVML path is exercised by ``tests/gpu/nvml_smoke.py`` on a GPU machine, and its
absence (no library here) by ``test_gpu.py``.
"""

# ruff: noqa: N802 - the fake must carry pynvml's function names

from __future__ import annotations

import dataclasses
import types
from typing import Any

import pynvml
import pytest


@dataclasses.dataclass
class FakeGpu:
    sm_clock_mhz: int = 1980
    sm_clock_max_mhz: int = 1980
    util_gpu: int = 97
    util_memory: int = 40
    power_mw: int = 650_000
    temperature_c: int = 61
    clocks_event_reasons: int = 0
    pcie_tx_kib_s: int = 1000
    pcie_rx_kib_s: int = 2000
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    nvlink_tx_kib: int | None = 0  # None: no NVLink on this board
    nvlink_rx_kib: int | None = 0
    ecc_corrected: int | None = 0  # None: no ECC on this board
    ecc_uncorrected: int | None = 0
    pids: list[int] = dataclasses.field(default_factory=list)
    xids: list[int] = dataclasses.field(default_factory=list)  # pending events, oldest first
    lost: bool = False
    uuid: str = ""  # "": GPU-<index> made up by the fake
    bus_id: str = ""  # "": 00000000:<index + 1>:00.0, NVML's spelling
    # nvml function name -> NVML error code it raises on this GPU
    fail: dict[str, int] = dataclasses.field(default_factory=dict)


class FakeNvml:
    """Stands in for the ``pynvml`` module."""

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = 0
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        # Constants, NVMLError and ctypes structures come from pynvml; functions never do
        # (that would call the real library).
        if name.startswith("nvml") and not name.startswith("nvmlEventType"):
            raise AttributeError(name)
        return getattr(pynvml, name)

    def _gpu(self, handle: int, fn: str) -> FakeGpu:
        self.calls.append(fn)
        if not self.initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in gpu.fail:
            raise pynvml.NVMLError(gpu.fail[fn])
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid or f"GPU-{h:08x}-fake"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        bus = self._gpu(h, "nvmlDeviceGetPciInfo").bus_id or f"00000000:{h + 1:02x}:00.0"
        return types.SimpleNamespace(busId=bus.encode())  # pynvml gives bytes

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        self._gpu(h, "nvmlDeviceGetMinorNumber")
        return h

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._gpu(h, "nvmlDeviceGetClockInfo").sm_clock_mhz

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._gpu(h, "nvmlDeviceGetMaxClockInfo").sm_clock_max_mhz

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        g = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=g.util_gpu, memory=g.util_memory)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu(h, "nvmlDeviceGetTemperature").temperature_c

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons").clocks_event_reasons

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return g.pcie_tx_kib_s if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kib_s

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width_max

    def nvmlDeviceGetFieldValues(self, h: int, fields: list[tuple[int, int]]) -> Any:
        g = self._gpu(h, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(fields))()
        for v, (field, scope) in zip(values, fields, strict=True):
            v.fieldId, v.scopeId = field, scope
            kib = {
                pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: g.nvlink_tx_kib,
                pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: g.nvlink_rx_kib,
            }.get(field)
            if kib is None or scope != 0xFFFFFFFF:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                v.nvmlReturn = pynvml.NVML_SUCCESS
                v.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                v.value.ullVal = kib
        return values

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        g = self._gpu(h, "nvmlDeviceGetTotalEccErrors")
        assert counter == pynvml.NVML_VOLATILE_ECC
        value = (
            g.ecc_corrected
            if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
            else g.ecc_uncorrected
        )
        if value is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return value

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        g = self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [pynvml.c_nvmlProcessInfo_t(pid=p, usedGpuMemory=1 << 30) for p in g.pids]

    def nvmlEventSetCreate(self) -> dict[str, int]:
        return {"device": -1}

    def nvmlDeviceRegisterEvents(self, h: int, types: int, events: dict[str, int]) -> None:
        assert types & pynvml.nvmlEventTypeXidCriticalError
        events["device"] = h

    def nvmlEventSetWait_v2(self, events: dict[str, int], timeout_ms: int) -> Any:
        assert timeout_ms == 0, "the sampler must never block on events"
        g = self.gpus[events["device"]]
        if not g.xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        data = pynvml.c_nvmlEventData_t()
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = g.xids.pop(0)
        return data

    def nvmlEventSetFree(self, events: dict[str, int]) -> None:
        events["device"] = -1


@pytest.fixture
def fake_nvml() -> FakeNvml:
    return FakeNvml([FakeGpu(pids=[101, 102]), FakeGpu(pids=[201])])


@pytest.fixture
def nvml_kit() -> Any:
    """The fake's classes, for tests that build their own GPUs (conftest modules cannot be
    imported under --import-mode=importlib)."""
    return types.SimpleNamespace(FakeNvml=FakeNvml, FakeGpu=FakeGpu)
