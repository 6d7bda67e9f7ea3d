"""What every hardware counter source gives the sampler: readings, a status, a clean close.

A source is one adapter to one outside interface (NVML, netlink, RDMA sysfs). It translates
that interface's errors into ``errors.HardwareError`` at its own boundary and never lets one
bad device stop the others: a counter that cannot be read on one device is left out and named
in ``warnings``; a source that is absent on the node raises ``errors.HardwareUnavailable`` from
``sample`` (each call retries, so a driver loaded later is picked up).

A reading is ``(device, metric, value)``; metric names are the agent's Prometheus names without
the ``collscope_`` prefix, as docs/spec/bundle-v1.md ``hw`` records use them, with units in the name
(``_bytes_total`` counters, ``_bytes_per_second`` rates, ``_mhz``, ``_watts``).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict


class Reading(NamedTuple):
    device: str
    metric: str
    value: float


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """Who a GPU is: NVML's index (PCI bus order), UUID (``GPU-...``), PCI bus id as sysfs
    spells it (``0000:18:00.0``) and the minor number of its ``/dev/nvidia<minor>``."""

    index: int
    uuid: str | None
    pci_bus_id: str | None
    minor: int | None


class SourceStatus(BaseModel):
    """Whether a source gave data at its last sample; ``reason`` says why not, or which
    counters it had to leave out (empty when all is well)."""

    model_config = ConfigDict(frozen=True)

    name: str
    available: bool
    reason: str = ""


class Source(abc.ABC):
    """One hardware counter source. Not thread-safe: the sampler calls it from one thread."""

    name: str = "source"

    def __init__(self) -> None:
        self.warnings: list[str] = []

    @abc.abstractmethod
    def sample(self, now_ns: int) -> list[Reading]:
        """Every counter readable now. Raises ``errors.HardwareUnavailable`` when the source
        is absent and ``errors.HardwareReadError`` when it fails as a whole; counters that fail
        alone are left out and described in ``self.warnings`` (reset at each call)."""

    def gpu_processes(self) -> dict[int, int]:
        """pid -> GPU index, as of the last sample; only the GPU source knows any."""
        return {}

    def gpu_inventory(self) -> list[GpuInfo]:
        """The node's GPUs as of the last time the source opened; only the GPU source knows."""
        return []

    def close(self) -> None:  # noqa: B027 - most sources hold nothing
        """Release handles (NVML, netlink sockets); the source may be sampled again after."""


class RateTracker:
    """Per-second rates from successive readings of monotonic counters.

    The first reading of a key gives no rate; a counter that went backwards (device reset,
    driver reload, 32-bit wrap) restarts the key rather than report a negative rate.
    """

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[int, float]] = {}

    def rate(self, device: str, counter: str, now_ns: int, value: float) -> float | None:
        key = (device, counter)
        last = self._last.get(key)
        self._last[key] = (now_ns, value)
        if last is None or now_ns <= last[0] or value < last[1]:
            return None
        return (value - last[1]) * 1e9 / (now_ns - last[0])


def finite(readings: list[Reading]) -> list[Reading]:
    """Drop NaN and infinities: bundle records are JSON, which has neither."""
    return [r for r in readings if math.isfinite(r.value)]
