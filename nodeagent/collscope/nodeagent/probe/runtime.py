"""The probe's per-process state machine: watch iterations, request, profile, summarise.

``Probe.on_event`` is called from the wrapped ``DataLoader`` ``__next__`` and the global
optimizer step hook, in the training thread; it never raises (every failure turns the probe
off and is noted in ``probe.<rank>.log`` in the trace directory). States:

- *watching*: ``iteration.IterationDetector`` learns the iteration and times it; on
  degradation a request for ``lead`` iterations ahead is written (``coordinate``), unless one
  younger than the cooldown exists; a watchdog thread writes the training thread's Python
  stack to ``stack.<rank>.txt`` (and a request) when an iteration is blocked for 5x its mean;
- every ``poll_s`` the request file is looked at; from its ``start_iteration`` on, this
  process runs ``torch.profiler`` (CPU, and CUDA when available, with Python stacks) and the
  CPU sampler for ``iterations`` iterations or ``window_s``, whichever ends first;
- then the Chrome trace is exported to a temporary file and summarised into
  ``functions.<rank>.jsonl`` in a background thread (the training thread only pays for the
  export).

Not profiling, an event costs one clock read, a few comparisons and, once per ``poll_s``, a
``stat`` (``bench/probe_overhead.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

import numpy as np

from collscope.nodeagent.probe import config, coordinate, iteration, sampler, summarise, trace


class Probe:
    def __init__(self, settings: config.ProbeSettings, torch: Any) -> None:
        self.s = settings
        self.torch = torch
        self.detector = iteration.IterationDetector()
        self.enabled = True
        self.main_tid = 0
        self.main_ident = 0
        self._next_poll_ns = 0
        self._seen_mtime = -1
        self._request: coordinate.Request | None = None
        self._done: set[str] = set()
        self._profiler: Any = None
        self._sampler: sampler.CpuSampler | None = None
        self._prof_start_ns = 0
        self._prof_start_iter = 0
        self._last_request_ns = 0
        self._lock = threading.Lock()
        self.summaries: list[threading.Thread] = []

    # -- events (training thread) ------------------------------------------------------------
    def on_event(self, kind: iteration.Event) -> None:
        if not self.enabled:
            return
        try:
            now = time.time_ns()
            if kind == "step":
                self.main_tid = threading.get_native_id()
                self.main_ident = threading.get_ident()
            if not self.detector.event(kind, now):
                return
            self._after_iteration(now)
        except Exception as e:  # never into user code
            self._fail(e)

    def _after_iteration(self, now: int) -> None:
        it = self.detector.iterations
        if self._profiler is not None:
            if it >= self._prof_start_iter + self._request_len() or (
                now - self._prof_start_ns >= self.s.window_s * 1e9
            ):
                self._stop_profiling()
            return
        if now >= self._next_poll_ns:
            self._next_poll_ns = now + int(self.s.poll_s * 1e9)
            self._poll()
        r = self._request
        if r is not None and r.id not in self._done and r.start_iteration <= it:
            if it < r.start_iteration + r.iterations:
                self._start_profiling(now)
            else:
                self._done.add(r.id)  # missed the window (joined late)
        elif self.detector.degraded():
            mean = self.detector.mean_ns() or 0.0
            best = min(self.detector.durations)
            self.request(
                f"rank {self.s.rank}: mean of the last {len(self.detector.durations)} "
                f"iterations {mean / 1e9:.3f} s > 1.05 x best {best / 1e9:.3f} s",
                now,
            )
            self.detector.durations.clear()  # judge the next 50 afresh

    def _poll(self) -> None:
        m = coordinate.request_mtime_ns(self.s.trace_dir)
        if m != self._seen_mtime:
            self._seen_mtime = m
            self._request = coordinate.read_request(self.s.trace_dir)

    def _request_len(self) -> int:
        return self._request.iterations if self._request is not None else self.s.iterations

    def request(self, reason: str, now: int) -> None:
        """Write a profiling request unless a recent one exists (any rank's)."""
        with self._lock:
            current = coordinate.read_request(self.s.trace_dir)
            recent = max(self._last_request_ns, current.created_ns if current else 0)
            if recent and now - recent < self.s.cooldown_s * 1e9:
                return
            self._last_request_ns = now
            r = coordinate.Request(
                id=f"{now}-{self.s.rank}",
                start_iteration=self.detector.iterations + self.s.lead,
                iterations=self.s.iterations,
                reason=reason,
                rank=self.s.rank,
                created_ns=now,
            )
            coordinate.write_request(self.s.trace_dir, r)
            self._seen_mtime = -1
            self._next_poll_ns = 0

    # -- profiling ------------------------------------------------------------------------------
    def _start_profiling(self, now: int) -> None:
        prof = self.torch.profiler
        acts = [prof.ProfilerActivity.CPU]
        if self.torch.cuda.is_available():
            acts.append(prof.ProfilerActivity.CUDA)
        self._profiler = prof.profile(activities=acts, with_stack=True)
        self._sampler = sampler.CpuSampler(self.s.sample_hz)
        self._sampler.start()
        self._profiler.start()
        self._prof_start_ns = time.time_ns()
        self._prof_start_iter = self.detector.iterations

    def _stop_profiling(self) -> None:
        prof, samp, req = self._profiler, self._sampler, self._request
        self._profiler = self._sampler = None
        window = (self._prof_start_ns, time.time_ns())
        prof.stop()
        cpu = samp.stop() if samp is not None else None
        if req is not None:
            self._done.add(req.id)
        fd, path = tempfile.mkstemp(prefix="collscope-trace-", suffix=".json")
        os.close(fd)
        prof.export_chrome_trace(path)
        t = threading.Thread(
            target=self._summarise, args=(path, window, cpu), name="collscope-summary", daemon=True
        )
        self.summaries.append(t)
        t.start()

    def _summarise(self, path: str, window: tuple[int, int], cpu: summarise.Samples | None) -> None:
        try:
            events = trace.load(path)
            samples = {} if cpu is None else {"cpu": cpu}
            samples |= _agent_samples(self.s.trace_dir, self.s.rank)
            pats = summarise.summarise(
                events, main_tid=self.main_tid, window=window, samples=samples
            )
            span = window[1] - window[0]
            lines = [
                json.dumps(
                    {
                        "rank": self.s.rank,
                        "fn": p.fn,
                        "kind": p.kind,
                        "beta": p.beta,
                        "mu": p.mu,
                        "sigma": p.sigma,
                        "window_ns": span,
                    }
                )
                + "\n"
                for p in pats
            ]
            coordinate.write_patterns(self.s.trace_dir, self.s.rank, lines)
        except Exception as e:
            self._fail(e)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)

    # -- watchdog -------------------------------------------------------------------------------
    def watch(
        self, stop: threading.Event, period_s: float = 0.5, min_blocked_s: float = 10.0
    ) -> None:
        """Watchdog loop (its own daemon thread): blocked training => stack dump + request.

        Blocked is EROICA's 5x the mean iteration, but at least ``min_blocked_s`` (ours: a
        job of millisecond iterations pauses that long for a checkpoint or a GC), and never
        while this process profiles.
        """
        dumped = False
        while not stop.wait(period_s):
            try:
                now = time.time_ns()
                if not self.enabled:
                    return
                last = self.detector.last_ns or now
                if (
                    self._profiler is None
                    and now - last >= min_blocked_s * 1e9
                    and self.detector.blocked(now)
                ):
                    if not dumped:
                        self._dump_stack()
                        self.request(f"rank {self.s.rank}: training blocked", now)
                        dumped = True
                else:
                    dumped = False
            except Exception as e:
                self._fail(e)

    def _dump_stack(self) -> None:
        frame = sys._current_frames().get(self.main_ident)
        text = "".join(traceback.format_stack(frame)) if frame is not None else "unknown\n"
        path = os.path.join(self.s.trace_dir, f"stack.{self.s.rank}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)

    def _fail(self, e: BaseException) -> None:
        self.enabled = False
        try:
            with open(os.path.join(self.s.trace_dir, f"probe.{self.s.rank}.log"), "a") as f:
                f.write(f"collscope probe off: {type(e).__name__}: {e}\n")
        except OSError:
            pass


def _agent_samples(trace_dir: str, rank: int) -> dict[str, summarise.Samples]:
    """``hw.<rank>.jsonl`` written by the node agent: {"ts": ns, "resource": "sm"|"nic",
    "value": 0..1} per line (optional; kernels and collectives get μ = sigma = 0 without it)."""
    path = os.path.join(trace_dir, f"hw.{rank}.jsonl")
    if not os.path.exists(path):
        return {}
    rows: dict[str, list[tuple[int, float]]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            rows.setdefault(str(d["resource"]), []).append((int(d["ts"]), float(d["value"])))
    out = {}
    for res, r in rows.items():
        r.sort()
        out[res] = summarise.Samples(
            np.array([x[0] for x in r], dtype=np.float64),
            np.clip(np.array([x[1] for x in r], dtype=np.float64), 0, 1),
        )
    return out
