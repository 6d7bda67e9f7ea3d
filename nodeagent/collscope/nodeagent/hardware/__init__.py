"""Hardware counters of the node: GPUs (NVML), NICs (netlink), RDMA ports (sysfs).

``Sampler`` runs the sources on a timer and keeps a bounded history of bundle-v1 ``hw``
records; ``default_sources`` builds the three sources a node agent runs. Each source reports
itself unavailable cleanly when its hardware is absent, and the agent keeps working.
"""

from __future__ import annotations

import pathlib
from typing import Any

from collscope.nodeagent.hardware import gpu, nic, rdma
from collscope.nodeagent.hardware.sampler import Sampler
from collscope.nodeagent.hardware.source import Reading, Source, SourceStatus

__all__ = ["Reading", "Sampler", "Source", "SourceStatus", "default_sources"]


def default_sources(
    *, sys_root: pathlib.Path = pathlib.Path("/sys"), nvml: Any = None
) -> list[Source]:
    """NVML (``nvml``: the ``pynvml`` module or a fake; None imports it on first use),
    netlink with link speeds from ``sys_root``, and RDMA ports under ``sys_root``."""
    return [
        gpu.GpuSource(nvml),
        nic.NicSource(sys_root=sys_root),
        rdma.RdmaSource(sys_root=sys_root),
    ]
