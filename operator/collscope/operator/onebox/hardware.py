"""Simulated hardware of a one-box node: a sysfs tree and an NVML backed by one JSON file.

The one-box agents run the real hardware sources (``hardware.gpu.GpuSource``,
``hardware.rdma.RdmaSource``) and the real device map (``hardware.devicemap``) on these, so a
fault can show in the hardware samples as it would on a node:

``<root>/sys``: for each local GPU ``i`` a PCIe root port ``0000:00:<i+1>.0`` with the GPU
(``0000:<2i+1>:00.0``) and an HCA ``mlx5_<i>`` (``0000:<2i+2>:00.0``) under it, so the HCA
nearest GPU ``i`` is ``mlx5_i``; each HCA has port 1 (``state``, ``rate``, ``counters/``) as
``/sys/class/infiniband`` gives them.

``<root>/nvml.json``: per GPU its UUID, bus id, the pids on it (the box writes each rank's pid
on its GPU) and the counters a fault changes (``clocks_event_reasons``, ``sm_clock_mhz``,
``pcie_link_gen``, ``xids``: XID events, appended). ``FileNvml`` implements ``gpu.Nvml`` by
reading it; the agent process and the box share nothing else.

``<root>/proc``: the node's ``/proc`` as its agent sees it (``proc_root``): one entry per rank
process of the node (``add_process``), its files links to the real ``/proc/<pid>`` but for
``cgroup``, which places it in its pod as a container runtime would (the agent resolves a
ring's writer only inside the pod whose volume holds the ring). A killed rank's links dangle:
the agent sees it gone, as it would.

``NodeHardware.apply(kind, local)`` writes a fault's hardware side (``SYMPTOMS``) from its
onset on; faults of software, processes and hosts have none.
"""

# ruff: noqa: N802 - FileNvml carries pynvml's function names

from __future__ import annotations

import json
import os
import pathlib
import threading
import types
from typing import Any, Final

import pynvml

from collscope.nodeagent.hardware import gpu, rdma, sampler

NVML_FILE: Final = "nvml.json"
RATE: Final = "400 Gb/sec (4X NDR)"
SLOW_RATE: Final = "100 Gb/sec (4X EDR)"  # a link that trained down
SM_CLOCK_MHZ: Final = 1980
CAPPED_SM_CLOCK_MHZ: Final = 1100
XID_GSP_TIMEOUT: Final = 119  # GSP RPC timeout: the GPU stopped answering (a hardware XID)
# fault -> what its culprit's hardware reports (the one-box faults, faults.py)
SYMPTOMS: Final[dict[str, dict[str, Any]]] = {
    "nic-down": {"nic_state": "1: DOWN"},
    "nic-slow": {"nic_rate": SLOW_RATE},
    "gpu-hang": {"xid": XID_GSP_TIMEOUT},
    "gpu-power-limit": {"clocks_event_reasons": 0x4, "sm_clock_mhz": CAPPED_SM_CLOCK_MHZ},
    "pcie-downgrade": {"pcie_link_gen": 3},
    "mixed-slow": {
        "clocks_event_reasons": 0x4,
        "sm_clock_mhz": CAPPED_SM_CLOCK_MHZ,
        "nic_rate": SLOW_RATE,
    },
}


def gpu_bus(i: int) -> str:
    return f"0000:{2 * i + 1:02x}:00.0"


def nic_bus(i: int) -> str:
    return f"0000:{2 * i + 2:02x}:00.0"


class NodeHardware:
    """One node's simulated GPUs and HCAs under ``root`` (``build`` makes them)."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.sys_root = root / "sys"
        self.proc_root = root / "proc"
        self._lock = threading.Lock()

    @classmethod
    def build(cls, root: pathlib.Path, gpus: int, *, seed: int = 0) -> NodeHardware:
        hw = cls(root)
        for i in range(gpus):
            port = ("pci0000:00", f"0000:00:{i + 1:02x}.0")
            for bdf in (gpu_bus(i), nic_bus(i)):
                where = hw.sys_root.joinpath("devices", *port, bdf)
                where.mkdir(parents=True, exist_ok=True)
                link = hw.sys_root / "bus" / "pci" / "devices" / bdf
                link.parent.mkdir(parents=True, exist_ok=True)
                if not link.is_symlink():
                    link.symlink_to(os.path.relpath(where, link.parent))
            hca = hw.sys_root / "class" / "infiniband" / f"mlx5_{i}"
            (hca / "ports" / "1" / "counters").mkdir(parents=True, exist_ok=True)
            if not (hca / "device").is_symlink():
                target = hw.sys_root / "bus" / "pci" / "devices" / nic_bus(i)
                (hca / "device").symlink_to(os.path.relpath(target, hca))
            hw.set_nic(i, state="4: ACTIVE", rate=RATE)
            for name in ("port_xmit_data", "port_rcv_data", "link_downed", "symbol_error"):
                (hca / "ports" / "1" / "counters" / name).write_text("0\n")
        state = {
            "gpus": [
                {
                    "uuid": f"GPU-{seed:08x}-{i:04x}-0000-0000-onebox{i:06d}",
                    "bus_id": f"0000{gpu_bus(i)}",  # NVML's 8-digit domain
                    "pids": [],
                    "sm_clock_mhz": SM_CLOCK_MHZ,
                    "clocks_event_reasons": 0,
                    "pcie_link_gen": 5,
                    "xids": [],
                }
                for i in range(gpus)
            ]
        }
        hw._write(state)
        return hw

    # -- state ----------------------------------------------------------------------------
    def _read(self) -> dict[str, Any]:
        state: dict[str, Any] = json.loads((self.root / NVML_FILE).read_text())
        return state

    def _write(self, state: dict[str, Any]) -> None:
        tmp = self.root / f".{NVML_FILE}.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(self.root / NVML_FILE)  # readers see the old file or the new, never half

    def update_gpu(self, i: int, **fields: Any) -> None:
        """Set counters of GPU ``i``; ``xid`` appends an XID event."""
        with self._lock:
            state = self._read()
            g = state["gpus"][i]
            xid = fields.pop("xid", None)
            if xid is not None:
                g["xids"].append(int(xid))
            g.update(fields)
            self._write(state)

    def add_process(self, pid: int, pod_uid: str) -> None:
        """Rank process ``pid`` in pod ``pod_uid``, as this node's ``/proc`` shows it."""
        d = self.proc_root / str(pid)
        d.mkdir(parents=True, exist_ok=True)
        for name in ("status", "stat", "environ", "cmdline", "root"):
            if not (d / name).is_symlink():
                (d / name).symlink_to(pathlib.Path("/proc") / str(pid) / name)
        # cgroup v2, cgroupfs driver (procs.py): the pod's directory, then the container's
        (d / "cgroup").write_text(f"0::/kubepods/besteffort/pod{pod_uid}/onebox-{pid}\n")

    def set_pids(self, i: int, pids: list[int]) -> None:
        self.update_gpu(i, pids=pids)

    def set_nic(self, i: int, *, state: str | None = None, rate: str | None = None) -> None:
        port = self.sys_root / "class" / "infiniband" / f"mlx5_{i}" / "ports" / "1"
        for name, text in (("state", state), ("rate", rate)):
            if text is not None:
                tmp = port / f".{name}.tmp"
                tmp.write_text(text + "\n")
                tmp.replace(port / name)

    def apply(self, kind: str, i: int) -> None:
        """The hardware side of fault ``kind`` on local GPU/HCA ``i`` (none for most)."""
        s = dict(SYMPTOMS.get(kind, {}))
        nic_state, nic_rate = s.pop("nic_state", None), s.pop("nic_rate", None)
        if nic_state is not None or nic_rate is not None:
            self.set_nic(i, state=nic_state, rate=nic_rate)
        if s:
            self.update_gpu(i, **s)

    # -- the agent's side -----------------------------------------------------------------
    def sampler(self, node: str, *, interval_s: float, history_s: float) -> sampler.Sampler:
        """What a one-box agent samples: NVML (``FileNvml``) and the RDMA ports."""
        nvml: gpu.Nvml = FileNvml(self.root / NVML_FILE)
        sources = [gpu.GpuSource(nvml), rdma.RdmaSource(sys_root=self.sys_root)]
        return sampler.Sampler(sources, node=node, interval_s=interval_s, history_s=history_s)


class FileNvml:
    """``gpu.Nvml`` over ``nvml.json``: pynvml's constants and error class; the GPUs' state is
    read when NVML opens and again at the first call of each sample (GPU 0's SM clock)."""

    NVMLError = pynvml.NVMLError
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC

    def __init__(self, path: pathlib.Path) -> None:
        self._path = path
        self._gpus: list[dict[str, Any]] = []
        self._xids_seen: dict[int, int] = {}

    def _reload(self) -> None:
        self._gpus = json.loads(self._path.read_text())["gpus"]

    def _gpu(self, h: int) -> dict[str, Any]:
        return self._gpus[h]

    def nvmlInit(self) -> None:
        try:
            self._reload()
        except (OSError, ValueError) as e:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED) from e

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return str(self._gpu(h)["uuid"])

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return types.SimpleNamespace(busId=str(self._gpu(h)["bus_id"]).encode())

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        return h

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in self._gpu(h)["pids"]]

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        if h == 0:
            self._reload()  # GpuSource's first call of each sample: the state as of now
        return int(self._gpu(h)["sm_clock_mhz"])

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return SM_CLOCK_MHZ  # a power cap lowers the clock, never the maximum

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return types.SimpleNamespace(gpu=97, memory=40)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return 650_000

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 61

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self._gpu(h)["clocks_event_reasons"])

    def nvmlDeviceGetPcieThroughput(self, h: int, counter: int) -> int:
        return 1000

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return int(self._gpu(h)["pcie_link_gen"])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetFieldValues(self, h: int, fields: list[tuple[int, int]]) -> Any:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # no NVLink here

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return 0

    def nvmlEventSetCreate(self) -> dict[str, int]:
        return {"device": -1}

    def nvmlDeviceRegisterEvents(self, h: int, types_: int, events: dict[str, int]) -> None:
        events["device"] = h

    def nvmlEventSetWait_v2(self, events: dict[str, int], timeout_ms: int) -> Any:
        h = events["device"]
        xids: list[int] = self._gpu(h)["xids"]
        seen = self._xids_seen.get(h, 0)
        if seen >= len(xids):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        self._xids_seen[h] = seen + 1
        return types.SimpleNamespace(eventType=pynvml.nvmlEventTypeXidCriticalError,
                                     eventData=xids[seen])  # fmt: skip

    def nvmlEventSetFree(self, events: dict[str, int]) -> None:
        events["device"] = -1
