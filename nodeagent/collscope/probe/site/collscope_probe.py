"""The dormant probe: sleeps in a daemon thread until the node agent arms it (EROICA §4.1).

Standard library only and any Python >= 3.9: the webhook copies this file and
``sitecustomize.py`` into the pod's plugin volume and puts that directory first on
``PYTHONPATH``, so it runs in whatever Python the training image has, with nothing installed.

Dormant, it costs the training thread nothing: its own thread ``stat``s the arm file every
``POLL_S`` and sleeps. The agent arms it by writing ``<COLLSCOPE_TRACE_DIR>/probe.arm``
(atomically, temporary file + rename)::

    {"id": "prof-1732001234", "window_s": 10.0, "deadline_ns": 1732001254000000000, "hz": 100}

Armed (a new ``id``, its deadline not passed), the thread samples the main thread's Python
stack ``hz`` times a second (``sys._current_frames``: no hook, no tracer, nothing installed in
the training code) with the main thread's CPU time (``pthread_getcpuclockid``; the process's
where that is missing) for ``window_s`` seconds or until ``deadline_ns``, whichever comes
first, and writes ``probe.<pid>.json`` beside the arm file::

    {"id": "prof-1732001234", "pid": 41, "rank": 3, "state": "done", "start_ns": ..,
     "end_ns": .., "hz": 100, "clock": "thread",
     "stacks": ["train.main;train.step;data.load_batch", ...],
     "samples": [[1732001234010000000, 0, 0.97], ...]}   # ts_ns, stack index (-1: none), util

When the training process has imported torch (``sys.modules``: the probe never imports it) and
initialised CUDA, torch's profiler records the same window (``TorchSource``: CUPTI through
Kineto, all threads): GPU kernels (``comm`` when NCCL's), memory copies and sets, as
``"torch": {"state": "done", "names": [...], "ops": [[name index, kind, start_ns, end_ns,
stream], ...], "dropped": 0}``; ``state`` ``off`` (no torch, or no CUDA: CPU operators are not
recorded, ~1.4 GB of profiler memory a second for a small-op loop on x86_64) or ``failed`` with
``reason`` (another profiler holds CUPTI, say). A failure of this source disarms it alone, with
one log line; the stack sampling goes on. The profiler is always switched off at the end.

``state`` is ``armed`` while it samples (the agent's proof that this process took the request),
then ``done``, or ``failed`` with ``reason``. The agent turns the samples into β, μ, sigma per
function (EROICA §4.2; ``collscope.nodeagent.profiling``). A function's identity is its
innermost ``MAX_STACK`` frames, ``module.qualname`` each. Sampling is EROICA's tracing
approximated: β of a function is its share of samples, so functions below 1/hz run time per
window are under-counted. That is below EROICA's β > 1 % floor at 100 Hz over 10 s.

Whatever happens, the probe disarms after the window: any exception ends the sampling, writes
``failed``, appends one line to ``probe.<pid>.log`` and goes dormant again. It never raises
into the training process.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

ARM_FILE = "probe.arm"
POLL_S = 0.5  # how often the dormant thread stats the arm file: arming waits at most this
MAX_STACK = 4  # frames in a function's identity: enough to tell callers apart, short to read
MAX_WINDOW_S = 120.0  # an arm file asking for longer is clipped: the probe always disarms
MAX_HZ = 1000.0  # a sample costs ~20 µs of the GIL; 1 kHz is ~2 % of one core
MAX_OPS = 200_000  # torch ops kept per window (~15 MB of JSON); the rest are counted as dropped
# torch operators that move or allocate memory: EROICA's memory kind, above Python on the path
MEMORY_OPS = ("pin_memory", "aten::copy_", "aten::to", "aten::_to_copy")
_HERE = os.path.abspath(__file__)[:-1] if __file__.endswith(".pyc") else os.path.abspath(__file__)

_started: dict[str, Any] = {}


def start(env: dict[str, str] | None = None) -> bool:
    """Start the dormant thread once per process; False when off or nowhere to look."""
    try:
        e = dict(os.environ) if env is None else env
        if e.get("COLLSCOPE_PROBE", "dormant").strip().lower() in ("0", "off", "false"):
            return False
        trace_dir = e.get("COLLSCOPE_TRACE_DIR", "")
        if not trace_dir or "probe" in _started:
            return "probe" in _started
        p = Probe(trace_dir, _rank(e))
        t = threading.Thread(target=p.run, name="collscope-probe", daemon=True)
        _started["probe"] = p
        t.start()
        return True
    except Exception:
        return False


def _rank(env: dict[str, str]) -> int | None:
    try:
        return int(env["RANK"])
    except (KeyError, ValueError):
        return None


class Probe:
    """The thread's state; ``run`` is its loop. ``clock_ns`` and ``sleep`` are for tests."""

    def __init__(
        self,
        trace_dir: str,
        rank: int | None,
        *,
        main_ident: int | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        poll_s: float = POLL_S,
    ) -> None:
        self.trace_dir = trace_dir
        self.rank = rank
        self.pid = os.getpid()
        self.main_ident = main_ident or threading.main_thread().ident or 0
        self.clock_ns = clock_ns
        self.poll_s = poll_s
        self.stop = threading.Event()
        self.seen: set[str] = set()
        self._mtime = 0
        self.armed = False

    @property
    def arm_path(self) -> str:
        return os.path.join(self.trace_dir, ARM_FILE)

    @property
    def out_path(self) -> str:
        return os.path.join(self.trace_dir, f"probe.{self.pid}.json")

    def run(self) -> None:
        while not self.stop.wait(self.poll_s):
            self.check()

    def check(self) -> str | None:
        """One dormant look at the arm file; profiles when newly armed. The id it ran, if any."""
        try:
            m = os.stat(self.arm_path).st_mtime_ns
        except OSError:
            return None
        if m == self._mtime:
            return None
        self._mtime = m
        req = _read(self.arm_path)
        if req is None or req["id"] in self.seen:
            return None
        self.seen.add(req["id"])
        if self.clock_ns() >= req["deadline_ns"]:
            return None
        self.profile(req)
        return str(req["id"])

    def profile(self, req: dict[str, Any]) -> None:
        """Sample for the window; always disarmed on return."""
        head = {"id": req["id"], "pid": self.pid, "rank": self.rank, "hz": req["hz"]}
        self.armed = True
        src = self.torch_source()
        try:
            start_ns = self.clock_ns()
            _write(self.out_path, dict(head, state="armed", start_ns=start_ns))
            end_ns = min(start_ns + int(req["window_s"] * 1e9), req["deadline_ns"])
            out = dict(head, state="done", start_ns=start_ns)
            self._torch_step(head, src, src.start)
            out.update(self.sample(end_ns, 1.0 / req["hz"]))
            out["end_ns"] = self.clock_ns()
            out["torch"] = self._torch_step(head, src, src.stop)
            _write(self.out_path, out)
        except Exception as e:
            self.fail(head, e)
        finally:
            src.close()
            self.armed = False

    def torch_source(self) -> TorchSource:
        """torch's profiler for the window (off without torch or CUDA); for tests to replace."""
        return TorchSource(sys.modules.get("torch"))

    def _torch_step(
        self, head: dict[str, Any], src: TorchSource, step: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        """A step of the torch source; its failure turns it off with one log line."""
        try:
            return step()
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"[:500]
            src.close()
            src.status = {"state": "failed", "reason": reason}
            self.log(f"collscope probe: torch profiler off ({head['id']}): {reason}")
            return src.status

    def sample(self, end_ns: int, period_s: float) -> dict[str, Any]:
        cpu, clock = _cpu_clock(self.main_ident)
        index: dict[tuple[Any, ...], int] = {}
        samples: list[list[Any]] = []
        wall0, cpu0 = self.clock_ns(), cpu()
        while not self.stop.wait(period_s):
            now, c = self.clock_ns(), cpu()
            frame = sys._current_frames().get(self.main_ident)
            key = _stack(frame)
            idx = index.setdefault(key, len(index)) if key else -1
            util = min(1.0, max(0.0, (c - cpu0) / max(1, now - wall0)))
            samples.append([now, idx, round(util, 4)])
            wall0, cpu0 = now, c
            if now >= end_ns:
                break
        del frame
        stacks = [";".join(k) for k in sorted(index, key=index.__getitem__)]
        return {"clock": clock, "stacks": stacks, "samples": samples}

    def fail(self, head: dict[str, Any], e: BaseException) -> None:
        reason = f"{type(e).__name__}: {e}"
        with contextlib.suppress(Exception):
            _write(self.out_path, dict(head, state="failed", reason=reason))
        self.log(f"collscope probe disarmed ({head['id']}): {reason}")

    def log(self, line: str) -> None:
        """One line in ``probe.<pid>.log`` beside the arm file (never raises)."""
        try:
            with open(os.path.join(self.trace_dir, f"probe.{self.pid}.log"), "a") as f:
                f.write(line + "\n")
        except Exception:
            return


class TorchSource:
    """torch's profiler (Kineto) over one armed window, all threads of the process.

    ``torch`` is the module the training code imported (None: off). CUDA activity only, and only
    once the process has initialised CUDA; ``cpu=True`` records CPU operators instead (tests: a
    live job's small-op loop would grow the profiler by ~1.4 GB a second). Private torch API
    (``torch._C._autograd``), torch >= 2.6 for ``profile_all_threads``: anything missing raises,
    which the probe turns into ``failed`` with its reason.
    """

    def __init__(self, torch: Any, *, cpu: bool = False) -> None:
        self.torch = torch
        self.cpu = cpu
        self.on = False
        self.status: dict[str, Any] = {"state": "off", "reason": "not started"}

    def start(self) -> dict[str, Any]:
        t = self.torch
        if t is None:
            self.status = {"state": "off", "reason": "torch not imported"}
            return self.status
        if not self.cpu and not (t.cuda.is_available() and t.cuda.is_initialized()):
            self.status = {"state": "off", "reason": "no CUDA in this process"}
            return self.status
        prof, autograd = t._C._profiler, t._C._autograd
        acts = {prof.ProfilerActivity.CPU if self.cpu else prof.ProfilerActivity.CUDA}
        cfg = prof.ProfilerConfig(
            prof.ProfilerState.KINETO, False, False, False, False, False,
            prof._ExperimentalConfig(profile_all_threads=True),
        )  # fmt: skip
        if autograd._profiler_enabled():
            raise RuntimeError("another torch profiler is running in this process")
        autograd._prepare_profiler(cfg, acts)
        autograd._enable_profiler(cfg, acts)
        self.on = True
        self.status = {"state": "on"}
        return self.status

    def stop(self) -> dict[str, Any]:
        """The window's kernels, copies and sets (CPU: memory operators); profiler off."""
        if not self.on:
            return self.status  # off or failed since start
        result = self.torch._C._autograd._disable_profiler()
        self.on = False
        names: dict[str, int] = {}
        ops: list[list[Any]] = []
        dropped = 0
        for e in result.events():
            name = e.name()
            kind = _op_kind(str(e.activity_type()), name)
            if kind is None:
                continue
            if len(ops) >= MAX_OPS:
                dropped += 1
                continue
            start = int(e.start_ns())
            idx = names.setdefault(name, len(names))
            ops.append([idx, kind, start, start + int(e.duration_ns()), e.device_resource_id()])
        return {"state": "done", "names": list(names), "ops": ops, "dropped": dropped}

    def close(self) -> None:
        """Switch the profiler off if this source left it on (never raises)."""
        if not self.on:
            return
        self.on = False
        try:
            self.torch._C._autograd._disable_profiler()
        except Exception:
            return


def _op_kind(activity: str, name: str) -> str | None:
    """EROICA's kind of a Kineto event, None for those left to the stack sampler."""
    if activity == "kernel":
        return "comm" if "nccl" in name.lower() else "kernel"
    if activity in ("gpu_memcpy", "gpu_memset"):
        return "memory"
    if activity == "cpu_op" and any(m in name for m in MEMORY_OPS):
        return "memory"
    return None


def _stack(frame: Any) -> tuple[str, ...]:
    """The innermost ``MAX_STACK`` frames outside this file, outermost first."""
    names: list[str] = []
    while frame is not None and len(names) < MAX_STACK:
        code = frame.f_code
        if os.path.abspath(code.co_filename) != _HERE:
            mod = frame.f_globals.get("__name__", "?")
            names.append(f"{mod}.{getattr(code, 'co_qualname', code.co_name)}")
        frame = frame.f_back
    return tuple(reversed(names))


def _cpu_clock(ident: int) -> tuple[Callable[[], int], str]:
    """The CPU time of thread ``ident`` (ns), else of the process."""
    try:
        cid = time.pthread_getcpuclockid(ident)
        time.clock_gettime_ns(cid)
        return (lambda: time.clock_gettime_ns(cid)), "thread"
    except (AttributeError, OSError, OverflowError):
        return time.process_time_ns, "process"


def _read(path: str) -> dict[str, Any] | None:
    """The arm request, bounded; None when unreadable or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        return {
            "id": str(d["id"])[:128],
            "window_s": min(MAX_WINDOW_S, max(0.1, float(d["window_s"]))),
            "deadline_ns": int(d["deadline_ns"]),
            "hz": min(MAX_HZ, max(1.0, float(d.get("hz", 100.0)))),
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)
