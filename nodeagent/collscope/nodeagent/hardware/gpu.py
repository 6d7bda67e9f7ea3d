"""GPU counters through NVML (``pynvml`` from the ``nvidia-ml-py`` package).

The NVML module is injected (a fake with the same function names in unit tests); by default
``pynvml`` is imported on first use, so an agent without it still starts. NVML's errors are
mapped here, and only here: ``nvmlInit`` failing (no driver, no library, no GPU) makes the
source unavailable; ``NVML_ERROR_NOT_SUPPORTED`` leaves that counter out on that GPU for good
(a consumer board has no ECC, a PCIe-only board no NVLink); ``NVML_ERROR_GPU_IS_LOST`` is itself
evidence and is reported as ``gpu_lost`` = 1; any other error leaves the counter out of this
sample and is named in ``warnings``.

Per GPU ``gpu<index>`` (NVML's index, which follows PCI bus order), each sample gives:

====================================  ==========================================================
``sm_clock_mhz``                      nvmlDeviceGetClockInfo(NVML_CLOCK_SM)
``sm_clock_max_mhz``                  nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM) (the profiled
                                      kernels' utilisation is SM clock / this, EROICA §4.2)
``gpu_utilization_percent``           nvmlDeviceGetUtilizationRates().gpu (kernel time share)
``memory_utilization_percent``        nvmlDeviceGetUtilizationRates().memory
``power_watts``                       nvmlDeviceGetPowerUsage() (milliwatts) / 1000
``temperature_celsius``               nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)
``clocks_event_reasons``              nvmlDeviceGetCurrentClocksEventReasons() bitmask
                                      (0x4 software power cap, 0x8 hardware slowdown, ...)
``pcie_{tx,rx}_bytes_per_second``     nvmlDeviceGetPcieThroughput() (KiB/s over NVML's own
                                      20 ms window) x 1024
``pcie_link_gen``, ``_gen_max``       current and maximum PCIe link generation
``pcie_link_width``, ``_width_max``   current and maximum lane count
``nvlink_{tx,rx}_bytes_total``        field NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX} with
                                      scopeId UINT_MAX (sum of all links), KiB x 1024
``nvlink_{tx,rx}_bytes_per_second``   from successive totals
``ecc_{corrected,uncorrected}_``      nvmlDeviceGetTotalEccErrors(volatile: since the driver
``errors_total``                      loaded)
``xid``                               one reading per XID event since the last sample, value
                                      the XID code (nvmlEventTypeXidCriticalError)
``xid_events_total``                  XID events seen by this source since it started
``gpu_lost``                          1 when NVML says the GPU fell off the bus, else 0
====================================  ==========================================================

The processes on each GPU (nvmlDeviceGetComputeRunningProcesses; host pids, since the agent
runs with ``hostPID``) map ranks to GPUs without trusting ``CUDA_VISIBLE_DEVICES``; each GPU's
UUID, PCI bus id and minor number (``gpu_inventory``, read once when NVML opens) place it
(``devicemap``). ``Nvml`` is the part of pynvml's interface this module calls: a fake of it
(tests, the one-box's file-backed GPUs) stands in for the real library.
"""

# ruff: noqa: N802 - the Nvml Protocol carries pynvml's function names

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any, Protocol

from collscope.nodeagent import errors
from collscope.nodeagent.hardware import pci, source

log = logging.getLogger(__name__)

# nvmlFieldValue_t.scopeId that asks for the sum over all NVLinks (nvml.h, "NVLink throughput
# counters field values").
ALL_LINKS = 0xFFFFFFFF
KIB = 1024
# XID events drained per GPU per sample: a storm of events must not stall the sampler; the
# rest are read at the next sample (NVML queues them).
MAX_XID_PER_SAMPLE = 64
XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError, if the module does not define it


class Nvml(Protocol):
    """What this module uses of ``pynvml`` (functions take and return pynvml's handles and
    ctypes structures, or objects with the same attributes)."""

    NVMLError: type[Exception]
    NVML_SUCCESS: int
    NVML_ERROR_GPU_IS_LOST: int
    NVML_ERROR_NOT_SUPPORTED: int
    NVML_ERROR_TIMEOUT: int
    NVML_CLOCK_SM: int
    NVML_TEMPERATURE_GPU: int
    NVML_PCIE_UTIL_TX_BYTES: int
    NVML_PCIE_UTIL_RX_BYTES: int
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: int
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: int
    NVML_MEMORY_ERROR_TYPE_CORRECTED: int
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int
    NVML_VOLATILE_ECC: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any: ...
    def nvmlDeviceGetUUID(self, h: Any) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, h: Any) -> Any: ...  # .busId
    def nvmlDeviceGetMinorNumber(self, h: Any) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]: ...
    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int: ...
    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any: ...
    def nvmlDeviceGetPowerUsage(self, h: Any) -> int: ...
    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int: ...
    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int: ...
    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int: ...
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> int: ...
    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int: ...
    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> int: ...
    def nvmlDeviceGetFieldValues(self, h: Any, fields: list[tuple[int, int]]) -> Any: ...
    def nvmlDeviceGetTotalEccErrors(self, h: Any, kind: int, counter: int) -> int: ...
    def nvmlEventSetCreate(self) -> Any: ...
    def nvmlDeviceRegisterEvents(self, h: Any, types: int, events: Any) -> None: ...
    def nvmlEventSetWait_v2(self, events: Any, timeout_ms: int) -> Any: ...
    def nvmlEventSetFree(self, events: Any) -> None: ...


class _GpuLostError(Exception):
    """NVML_ERROR_GPU_IS_LOST inside one device's sample: stop reading that device."""


class GpuSource(source.Source):
    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        super().__init__()
        self._injected = nvml
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._events: dict[int, Any] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._rates = source.RateTracker()
        self._xid_total: dict[int, int] = {}
        self._processes: dict[int, int] = {}
        self._inventory: list[source.GpuInfo] = []

    # -- lifecycle ---------------------------------------------------------------------------
    def _open(self) -> Any:
        if self._nvml is not None:
            return self._nvml
        nvml = self._injected
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except ImportError as e:
                raise errors.HardwareUnavailable(f"NVML: pynvml not installed ({e})") from e
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise errors.HardwareUnavailable(f"NVML: {e}") from e
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as e:
            nvml.nvmlShutdown()
            raise errors.HardwareUnavailable(f"NVML: listing GPUs: {e}") from e
        if not handles:
            nvml.nvmlShutdown()
            raise errors.HardwareUnavailable("NVML: no GPU on this node")
        self._nvml, self._handles = nvml, handles
        self._inventory = [_identity(nvml, i, h) for i, h in enumerate(handles)]
        self._events = {}
        xid_type = getattr(nvml, "nvmlEventTypeXidCriticalError", XID_CRITICAL)
        for i, h in enumerate(handles):
            # One event set per GPU, so an event's GPU is known without comparing handles.
            try:
                events = nvml.nvmlEventSetCreate()
                nvml.nvmlDeviceRegisterEvents(h, xid_type, events)
            except nvml.NVMLError as e:
                log.info("gpu%d: XID events not available: %s", i, e)
                continue
            self._events[i] = events
        return nvml

    def close(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is None:
            return
        for events in self._events.values():
            try:
                nvml.nvmlEventSetFree(events)
            except nvml.NVMLError as e:
                log.debug("nvmlEventSetFree: %s", e)
        self._events = {}
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:
            log.debug("nvmlShutdown: %s", e)

    def gpu_processes(self) -> dict[int, int]:
        return dict(self._processes)

    def gpu_inventory(self) -> list[source.GpuInfo]:
        return list(self._inventory)

    # -- sampling ----------------------------------------------------------------------------
    def sample(self, now_ns: int) -> list[source.Reading]:
        nvml = self._open()
        self.warnings = []
        out: list[source.Reading] = []
        processes: dict[int, int] = {}
        for i, h in enumerate(self._handles):
            dev = f"gpu{i}"
            try:
                out += self._device(nvml, i, dev, h, now_ns)
                for proc in self._call(nvml, i, nvml.nvmlDeviceGetComputeRunningProcesses, h) or []:
                    processes[int(proc.pid)] = i
            except _GpuLostError:
                out.append(source.Reading(dev, "gpu_lost", 1.0))
                continue
            out.append(source.Reading(dev, "gpu_lost", 0.0))
        self._processes = processes
        return source.finite(out)

    def _call(self, nvml: Any, i: int, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; None when the counter is not supported or failed this time."""
        key = (i, getattr(fn, "__name__", repr(fn)))
        if key in self._unsupported:
            return None
        try:
            return fn(*args)
        except nvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _GpuLostError from e
            if code == nvml.NVML_ERROR_NOT_SUPPORTED:
                self._unsupported.add(key)
                return None
            self.warnings.append(f"gpu{i}: {key[1]}: {e}")
            return None

    def _device(self, nvml: Any, i: int, dev: str, h: Any, now_ns: int) -> list[source.Reading]:
        out: list[source.Reading] = []

        def put(metric: str, value: Any, scale: float = 1.0) -> None:
            if value is not None:
                out.append(source.Reading(dev, metric, float(value) * scale))

        call = self._call
        put("sm_clock_mhz", call(nvml, i, nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM))
        # Optional in ``Nvml``: a stand-in without it leaves the counter out, never the sample.
        max_clock = getattr(nvml, "nvmlDeviceGetMaxClockInfo", None)
        if max_clock is not None:
            put("sm_clock_max_mhz", call(nvml, i, max_clock, h, nvml.NVML_CLOCK_SM))
        util = call(nvml, i, nvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            put("gpu_utilization_percent", util.gpu)
            put("memory_utilization_percent", util.memory)
        put("power_watts", call(nvml, i, nvml.nvmlDeviceGetPowerUsage, h), 1e-3)
        temp = call(nvml, i, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        put("temperature_celsius", temp)
        # "ClocksThrottleReasons" is the pre-535 name of the same call.
        reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if reasons_fn is None:
            reasons_fn = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        put("clocks_event_reasons", call(nvml, i, reasons_fn, h))
        tx, rx = nvml.NVML_PCIE_UTIL_TX_BYTES, nvml.NVML_PCIE_UTIL_RX_BYTES
        put("pcie_tx_bytes_per_second", call(nvml, i, nvml.nvmlDeviceGetPcieThroughput, h, tx), KIB)
        put("pcie_rx_bytes_per_second", call(nvml, i, nvml.nvmlDeviceGetPcieThroughput, h, rx), KIB)
        put("pcie_link_gen", call(nvml, i, nvml.nvmlDeviceGetCurrPcieLinkGeneration, h))
        put("pcie_link_gen_max", call(nvml, i, nvml.nvmlDeviceGetMaxPcieLinkGeneration, h))
        put("pcie_link_width", call(nvml, i, nvml.nvmlDeviceGetCurrPcieLinkWidth, h))
        put("pcie_link_width_max", call(nvml, i, nvml.nvmlDeviceGetMaxPcieLinkWidth, h))
        out += self._nvlink(nvml, i, dev, h, now_ns)
        for kind, name in (
            (nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "ecc_corrected_errors_total"),
            (nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "ecc_uncorrected_errors_total"),
        ):
            ecc = nvml.nvmlDeviceGetTotalEccErrors
            put(name, call(nvml, i, ecc, h, kind, nvml.NVML_VOLATILE_ECC))
        out += self._xids(nvml, i, dev)
        return out

    def _nvlink(self, nvml: Any, i: int, dev: str, h: Any, now_ns: int) -> list[source.Reading]:
        fields = [
            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
        ]
        values = self._call(nvml, i, nvml.nvmlDeviceGetFieldValues, h, fields)
        if values is None:
            return []
        out: list[source.Reading] = []
        for direction, value in zip(("tx", "rx"), values, strict=True):
            if value.nvmlReturn != nvml.NVML_SUCCESS:
                # Per-field status: NOT_SUPPORTED on boards without NVLink.
                continue
            total = float(value.value.ullVal) * KIB
            out.append(source.Reading(dev, f"nvlink_{direction}_bytes_total", total))
            rate = self._rates.rate(dev, f"nvlink_{direction}", now_ns, total)
            if rate is not None:
                out.append(source.Reading(dev, f"nvlink_{direction}_bytes_per_second", rate))
        return out

    def _xids(self, nvml: Any, i: int, dev: str) -> list[source.Reading]:
        events = self._events.get(i)
        if events is None:
            return []
        out: list[source.Reading] = []
        for _ in range(MAX_XID_PER_SAMPLE):
            try:
                data = nvml.nvmlEventSetWait_v2(events, 0)  # 0 ms: never block the sampler
            except nvml.NVMLError as e:
                if getattr(e, "value", None) != nvml.NVML_ERROR_TIMEOUT:
                    self.warnings.append(f"{dev}: nvmlEventSetWait_v2: {e}")
                break
            out.append(source.Reading(dev, "xid", float(data.eventData)))
            self._xid_total[i] = self._xid_total.get(i, 0) + 1
        out.append(source.Reading(dev, "xid_events_total", float(self._xid_total.get(i, 0))))
        return out


def _identity(nvml: Any, i: int, h: Any) -> source.GpuInfo:
    """A GPU's UUID, PCI bus id and minor number; a field NVML does not give stays None."""

    def ask(fn: Callable[[Any], Any]) -> Any:
        try:
            return fn(h)
        except nvml.NVMLError as e:
            log.info("gpu%d: %s: %s", i, getattr(fn, "__name__", fn), e)
            return None

    uuid = ask(nvml.nvmlDeviceGetUUID)
    pci_info = ask(nvml.nvmlDeviceGetPciInfo)
    minor = ask(nvml.nvmlDeviceGetMinorNumber)
    bus = None if pci_info is None else pci.normalise(getattr(pci_info, "busId", b""))
    return source.GpuInfo(
        index=i,
        uuid=(uuid.decode() if isinstance(uuid, bytes) else uuid) or None,
        pci_bus_id=bus,
        minor=None if minor is None else int(minor),
    )
