"""CPU utilisation of the training process, sampled while profiling (the probe's own hardware
samples when the node agent supplies none, e.g. on CPU-only runs).

Each sample is the process CPU time (``time.process_time_ns``: CLOCK_PROCESS_CPUTIME_ID, ns
resolution) spent since the previous sample over the wall time between them, clipped to
[0, 1] (one core); below 1 % it is recorded as 0 so that Algorithm 1's zero runs mean idle.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from collscope.nodeagent.probe import summarise


class CpuSampler:
    def __init__(self, hz: float) -> None:
        self.period_s = 1.0 / hz
        self._ts: list[int] = []
        self._val: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="collscope-cpu", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> summarise.Samples:
        self._stop.set()
        self._thread.join(timeout=1.0)
        return summarise.Samples(
            np.asarray(self._ts, dtype=np.float64), np.asarray(self._val, dtype=np.float64)
        )

    def _run(self) -> None:
        wall, cpu = time.time_ns(), time.process_time_ns()
        while not self._stop.wait(self.period_s):
            w, c = time.time_ns(), time.process_time_ns()
            u = (c - cpu) / max(1, w - wall)
            self._ts.append(w)
            self._val.append(0.0 if u < 0.01 else min(1.0, u))
            wall, cpu = w, c
