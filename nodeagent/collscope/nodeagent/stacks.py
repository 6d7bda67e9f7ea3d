"""Python stacks of training processes through ``py-spy dump --json``, grouped by stack.

Mycroft (§5.3) and the hang-diagnosis practice it cites take stacks of every rank once a
trigger fires: the ranks whose stack differs from the rest point at the culprit. py-spy reads
the target with ``process_vm_readv`` and pauses it with ptrace (it needs ``CAP_SYS_PTRACE``
and ``hostPID`` in a container). It has no timeout option and can hang while pausing a
target, so each process gets its own hard deadline: py-spy is killed at ``timeout_s`` and
the target is sent ``SIGCONT`` in case the killed tracer left it stopped (py-spy #416). All
processes are dumped concurrently, so a dump takes about the slowest process's time.

Only training processes: py-spy pauses its target and reads its memory as root, so the agent
wraps its dumper in ``guarded``, which refuses (per pid, with the reason) every pid that
``procs.TrainingProcesses`` does not place in a discovered training pod; and one ``slots``
semaphore per agent caps py-spy runs at once across all requests (``MAX_RUNNING``).

Input, ``py-spy dump --json --pid N`` (0.4.x), one object per thread::

    [{"pid": 4242, "thread_id": 1397..., "thread_name": "MainThread", "os_thread_id": 4242,
      "active": true, "owns_gil": false,
      "frames": [{"name": "wait", "filename": "/usr/lib/python3.11/threading.py",
                  "short_filename": "threading.py", "line": 320, ...}, ...]}]

Output: one ``StackGroup`` per distinct thread stack (frames innermost first, as py-spy
lists them, each ``"name (short_filename:line)"``) with the pids that have a thread in it;
failures per pid in ``errors``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# stderr kept per failure: enough for py-spy's one-line reasons, bounded for the API.
STDERR_CHARS = 400
# Concurrent py-spy processes: one per rank of an 8-GPU node twice over; each is ~10 MB RSS.
MAX_PARALLEL = 16
# py-spy runs at once across all requests of one agent: two requests for a full 8-GPU node.
MAX_RUNNING = 16


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class StackGroup(_Model):
    frames: list[str]
    pids: list[int]
    thread_names: list[str] = Field(default_factory=list)


class StackError(_Model):
    """Why a process has no stack; ``rank`` (and no pid) when asked for by rank and its
    process could not be found on the host."""

    pid: int | None
    reason: str
    rank: int | None = None


class StacksReport(_Model):
    groups: list[StackGroup] = Field(default_factory=list)
    errors: list[StackError] = Field(default_factory=list)


def frame_text(frame: dict[str, Any]) -> str:
    where = frame.get("short_filename") or frame.get("filename") or "?"
    return f"{frame.get('name', '?')} ({where}:{frame.get('line', '?')})"


def _message(stderr: str) -> str:
    """py-spy's error on one line, without the Rust backtrace it may append."""
    text = stderr.split("Stack backtrace:", 1)[0]
    return " ".join(text.split())[:STDERR_CHARS] or "no message"


def _reason(rc: int, stderr: str) -> str:
    text = _message(stderr)
    lower = text.lower()
    if "permission denied" in lower or "operation not permitted" in lower:
        return (
            "ptrace not permitted (the agent needs CAP_SYS_PTRACE and hostPID; "
            f"kernel.yama.ptrace_scope may forbid it): {text}"
        )
    if "no such file or directory" in lower or "no such process" in lower:
        return f"no such process: {text}"
    return f"py-spy exited with {rc}: {text}"


def parse(stdout: str) -> list[tuple[tuple[str, ...], str]]:
    """``(frames, thread name)`` per thread of one ``py-spy dump --json`` output."""
    threads = json.loads(stdout)
    if not isinstance(threads, list):
        raise ValueError("expected a JSON list of threads")
    out = []
    for t in threads:
        frames = tuple(frame_text(f) for f in t.get("frames") or [])
        # py-spy 0.4 often leaves thread_name null; the main thread's tid is the pid.
        name = t.get("thread_name") or (
            "MainThread" if t.get("os_thread_id") == t.get("pid") else "unnamed"
        )
        out.append((frames, str(name)))
    return out


def group(per_pid: dict[int, list[tuple[tuple[str, ...], str]]]) -> list[StackGroup]:
    """Identical thread stacks merged; largest groups first, then by frames."""
    pids: dict[tuple[str, ...], set[int]] = {}
    names: dict[tuple[str, ...], set[str]] = {}
    for pid, threads in per_pid.items():
        for frames, name in threads:
            pids.setdefault(frames, set()).add(pid)
            names.setdefault(frames, set()).add(name)
    return [
        StackGroup(frames=list(f), pids=sorted(pids[f]), thread_names=sorted(names[f]))
        for f in sorted(pids, key=lambda f: (-len(pids[f]), f))
    ]


def dump(
    pids: Sequence[int],
    *,
    timeout_s: float = 5.0,
    pyspy: str = "py-spy",
    native: bool = False,
    nonblocking: bool = False,
    max_parallel: int = MAX_PARALLEL,
    slots: threading.Semaphore | None = None,
) -> StacksReport:
    """Dump the stacks of ``pids`` concurrently; never raises for a process's failure.
    ``slots``: shared by every request of an agent, a run waits for one until ``timeout_s``."""
    unique = list(dict.fromkeys(pids))
    per_pid: dict[int, list[tuple[tuple[str, ...], str]]] = {}
    errors: list[StackError] = []
    if not unique:
        return StacksReport()
    with futures.ThreadPoolExecutor(max_workers=min(len(unique), max_parallel)) as pool:
        jobs = {
            pid: pool.submit(
                _limited,
                pid,
                pyspy,
                timeout_s,
                native=native,
                nonblocking=nonblocking,
                slots=slots,
            )
            for pid in unique
        }
        for pid, job in jobs.items():
            result = job.result()
            if isinstance(result, StackError):
                errors.append(result)
            else:
                per_pid[pid] = result
    return StacksReport(groups=group(per_pid), errors=errors)


def _limited(
    pid: int,
    pyspy: str,
    timeout_s: float,
    *,
    native: bool,
    nonblocking: bool,
    slots: threading.Semaphore | None,
) -> list[tuple[tuple[str, ...], str]] | StackError:
    if slots is None:
        return _one(pid, pyspy, timeout_s, native, nonblocking)
    start = time.monotonic()
    if not slots.acquire(timeout=timeout_s):
        return StackError(pid=pid, reason=f"busy: no py-spy slot free within {timeout_s:g} s")
    try:
        left = max(0.1, timeout_s - (time.monotonic() - start))
        return _one(pid, pyspy, left, native, nonblocking)
    finally:
        slots.release()


def guarded(
    dumper: Callable[[Sequence[int], float], BaseModel], refusal: Callable[[int], str | None]
) -> Callable[[Sequence[int], float], BaseModel]:
    """``dumper`` called with the pids ``refusal`` accepts only; each refused pid becomes a
    ``StackError`` with the reason (py-spy never runs against it)."""

    def dump(pids: Sequence[int], timeout_s: float) -> BaseModel:
        unique = list(dict.fromkeys(pids))
        refused = {p: r for p in unique if (r := refusal(p)) is not None}
        errs = [StackError(pid=p, reason=r) for p, r in refused.items()]
        allowed = [p for p in unique if p not in refused]
        if not allowed:
            return StacksReport(errors=errs)
        report = dumper(allowed, timeout_s)
        if errs and isinstance(report, StacksReport):
            report = report.model_copy(update={"errors": [*report.errors, *errs]})
        return report

    return dump


def _one(
    pid: int, pyspy: str, timeout_s: float, native: bool, nonblocking: bool
) -> list[tuple[tuple[str, ...], str]] | StackError:
    cmd = [_resolve(pyspy), "dump", "--json", "--pid", str(pid)]
    cmd += ["--native"] if native else []
    cmd += ["--nonblocking"] if nonblocking else []
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        return StackError(pid=pid, reason=f"py-spy not found: {pyspy!r}")
    except OSError as e:
        return StackError(pid=pid, reason=f"cannot run {pyspy!r}: {e}")
    try:
        # communicate() drains both pipes while waiting: py-spy's JSON for a process with many
        # threads exceeds a pipe buffer.
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        _resume(pid)
        return StackError(pid=pid, reason=f"py-spy timed out after {timeout_s:g} s (killed)")
    if proc.returncode != 0:
        return StackError(pid=pid, reason=_reason(proc.returncode, stderr))
    try:
        return parse(stdout)
    except (ValueError, AttributeError, TypeError) as e:
        return StackError(pid=pid, reason=f"unreadable py-spy output: {e}")


def _resolve(pyspy: str) -> str:
    """A bare name is looked up on PATH, then beside this interpreter: the py-spy wheel
    installs its binary into the environment's bin/, which need not be on PATH."""
    if os.sep in pyspy or shutil.which(pyspy):
        return pyspy
    beside = pathlib.Path(sys.executable).parent / pyspy
    return str(beside) if beside.exists() else pyspy


def _resume(pid: int) -> None:
    """SIGCONT a target a killed py-spy may have left ptrace-stopped; harmless otherwise."""
    with contextlib.suppress(OSError):  # gone already: nothing to resume
        os.kill(pid, signal.SIGCONT)
