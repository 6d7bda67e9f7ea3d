"""GPU smoke check of the NVML source against the real driver (not collected by pytest).

Run on any machine, from the repository root::

    .venv/bin/python tests/gpu/nvml_smoke.py

Without an NVIDIA driver it prints ``no GPU: <reason>`` and exits 0. With one it samples every
GPU twice, one second apart, through the same ``Sampler`` the agent runs, prints each
reading, and exits 1 if a metric the analysis relies on (``sm_clock_mhz``,
``clocks_event_reasons``, ``pcie_link_gen``) is missing on any GPU or the source reports a
problem.
"""

from __future__ import annotations

import socket
import sys
import time

from collscope.nodeagent import hardware
from collscope.nodeagent.hardware import gpu

REQUIRED = ("sm_clock_mhz", "clocks_event_reasons", "pcie_link_gen")


def main() -> int:
    sampler = hardware.Sampler([gpu.GpuSource()], node=socket.gethostname(), interval_s=1.0)
    try:
        sampler.sample_once()
        (status,) = sampler.statuses()
        if not status.available:
            print(f"no GPU: {status.reason}")
            return 0
        time.sleep(1.0)  # a second sample gives the NVLink rates
        records = sampler.sample_once()
        (status,) = sampler.statuses()
    finally:
        sampler.stop()
    for r in records:
        print(f"{r.device:8} {r.metric:34} {r.value:g}")
    print(f"processes (pid -> gpu): {sampler.gpu_processes()}")
    print(f"status: available={status.available} reason={status.reason!r}")
    devices = sorted({r.device for r in records})
    missing = [
        f"{d}:{m}"
        for d in devices
        for m in REQUIRED
        if not any(r.device == d and r.metric == m for r in records)
    ]
    if missing or status.reason:
        print(f"FAIL: missing {missing}; source said {status.reason!r}")
        return 1
    print(f"OK: {len(devices)} GPU(s), {len(records)} readings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
