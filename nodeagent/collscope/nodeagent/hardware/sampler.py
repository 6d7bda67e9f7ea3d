"""Samples every hardware source on a timer into a bounded, time-ordered history.

One daemon thread calls each source in turn every ``interval_s``; a source that is absent or
fails is recorded in its status and the others carry on (a bug in one source is logged and
reported the same way, never allowed to end the thread). Samples become bundle-v1 ``hw``
records (docs/spec/bundle-v1.md) and are kept for ``history_s``, oldest dropped first; all methods
are safe to call from other threads (the HTTP server, the exporter).

``rank`` of a record: hardware belongs to a node, not to a rank, so records are made with
rank 0; whoever knows the rank -> device mapping (``devicemap``: the service, which knows the
rings' processes) gives them the rank of the device's user when it serves a window.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from collscope.nodeagent import errors
from collscope.nodeagent.bundle import models
from collscope.nodeagent.hardware import source

log = logging.getLogger(__name__)
# Counter problems named in a status reason; the rest are counted.
MAX_WARNINGS = 8


class Sampler:
    def __init__(
        self,
        sources: Sequence[source.Source],
        *,
        node: str,
        interval_s: float = 1.0,
        history_s: float = 120.0,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if interval_s <= 0 or history_s <= 0:
            raise ValueError(f"interval_s and history_s must be > 0 ({interval_s}, {history_s})")
        self._sources = list(sources)
        self._node = node
        self._interval_s = interval_s
        self._history_ns = int(history_s * 1e9)
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        # (ts, records of that sample), ts ascending: one entry per sample_once call.
        self._history: deque[tuple[int, list[models.HwRecord]]] = deque()
        self._statuses = {
            s.name: source.SourceStatus(name=s.name, available=False, reason="not sampled yet")
            for s in self._sources
        }
        self._processes: dict[int, int] = {}
        self._inventory: list[source.GpuInfo] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Serialises sample_once between the thread and direct callers (sources are not
        # thread-safe); distinct from _lock so readers never wait for NVML.
        self._sampling = threading.Lock()

    # -- thread ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="collscope-hw", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=max(5.0, 2 * self._interval_s))
        with self._sampling:
            for s in self._sources:
                try:
                    s.close()
                except Exception:  # a source's close must not keep the others open
                    log.exception("closing hardware source %s", s.name)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.sample_once()
            # Fixed-rate schedule; after a stall, skip the missed ticks instead of bursting.
            next_at += self._interval_s
            now = time.monotonic()
            next_at = max(next_at, now)
            self._stop.wait(next_at - now)

    # -- sampling ----------------------------------------------------------------------------
    def sample_once(self) -> list[models.HwRecord]:
        """Sample every source now; returns this sample's records (also kept in history)."""
        with self._sampling:
            ts = self._clock_ns()
            records: list[models.HwRecord] = []
            statuses: dict[str, source.SourceStatus] = {}
            processes: dict[int, int] = {}
            inventory: list[source.GpuInfo] = []
            for s in self._sources:
                readings, status = self._one(s, ts)
                statuses[s.name] = status
                records += [
                    models.HwRecord(
                        rank=0,
                        ts=ts,
                        node=self._node,
                        device=r.device,
                        metric=r.metric,
                        value=r.value,
                    )
                    for r in readings
                ]
                processes.update(s.gpu_processes())
                inventory += s.gpu_inventory()
            with self._lock:
                self._history.append((ts, records))
                cutoff = ts - self._history_ns
                while self._history and self._history[0][0] < cutoff:
                    self._history.popleft()
                self._statuses = statuses
                self._processes = processes
                self._inventory = inventory
            return records

    def _one(self, s: source.Source, ts: int) -> tuple[list[source.Reading], source.SourceStatus]:
        try:
            readings = s.sample(ts)
        except errors.HardwareUnavailable as e:
            return [], source.SourceStatus(name=s.name, available=False, reason=str(e))
        except errors.HardwareError as e:
            self._log_once(s.name, str(e), exc=False)
            return [], source.SourceStatus(name=s.name, available=False, reason=str(e))
        except Exception as e:  # a bug in one source must not stop the others
            reason = f"internal error: {type(e).__name__}: {e}"
            self._log_once(s.name, reason, exc=True)
            return [], source.SourceStatus(name=s.name, available=False, reason=reason)
        partial = "; ".join(s.warnings[:MAX_WARNINGS])
        if len(s.warnings) > MAX_WARNINGS:
            partial += f"; and {len(s.warnings) - MAX_WARNINGS} more"
        return readings, source.SourceStatus(name=s.name, available=True, reason=partial)

    def _log_once(self, name: str, reason: str, *, exc: bool) -> None:
        """Log a failure when it starts or changes, not at every sample."""
        with self._lock:
            previous = self._statuses.get(name)
        if previous is not None and previous.reason == reason:
            return
        if exc:
            log.exception("hardware source %s: %s", name, reason)
        else:
            log.warning("hardware source %s: %s", name, reason)

    # -- readers -----------------------------------------------------------------------------
    def window(self, since_ns: int, until_ns: int) -> list[models.HwRecord]:
        """Records with ``since_ns <= ts <= until_ns``, oldest first."""
        with self._lock:
            history = list(self._history)
        keys = [ts for ts, _ in history]
        lo = bisect.bisect_left(keys, since_ns)
        hi = bisect.bisect_right(keys, until_ns)
        return [r for _, records in history[lo:hi] for r in records]

    def latest(self) -> list[models.HwRecord]:
        """The records of the last sample (empty before the first)."""
        with self._lock:
            return list(self._history[-1][1]) if self._history else []

    def statuses(self) -> list[source.SourceStatus]:
        with self._lock:
            return list(self._statuses.values())

    def gpu_processes(self) -> dict[int, int]:
        """pid -> GPU index from the last sample ({} without NVML)."""
        with self._lock:
            return dict(self._processes)

    def gpu_inventory(self) -> list[source.GpuInfo]:
        """The node's GPUs (index, UUID, PCI bus id, minor) as NVML last listed them ([]
        without NVML)."""
        with self._lock:
            return list(self._inventory)
