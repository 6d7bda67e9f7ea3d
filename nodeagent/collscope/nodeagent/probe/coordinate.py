"""Coordinated profiling through the shared trace directory (EROICA §4.1, "global synchronized
profiling" by iteration id).

The file ``$COLLSCOPE_TRACE_DIR/profile-request.json`` names the window every rank profiles::

    {"id": "1732001234000000000-3", "start_iteration": 1210, "iterations": 20,
     "reason": "rank 3: mean of the last 50 iterations 1.31 s > 1.05 x best 1.02 s",
     "rank": 3, "created_ns": 1732001234000000000}

A rank that detects degradation writes it (when there is none younger than the cooldown),
with ``start_iteration`` = its own iteration count + ``lead``: ranks of a synchronous job
complete iterations in lockstep, so their counts agree to within one or two. The node agent
copies the file between the trace directories of the job's pods (it sees them all); in a
single-node job the directory may simply be shared. Every rank polls the file (one ``stat``
per ``poll_s``), starts its profiler at the first iteration >= ``start_iteration`` and stops
after ``iterations`` or ``window_s``, then writes ``functions.<rank>.jsonl`` (the lines of
``functions.jsonl`` in docs/spec/bundle-v1.md) next to it for the agent to pick up.
Writes are atomic (temporary file + rename).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

REQUEST = "profile-request.json"


@dataclass(frozen=True)
class Request:
    id: str
    start_iteration: int
    iterations: int
    reason: str
    rank: int
    created_ns: int


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_request(trace_dir: str, r: Request) -> None:
    _atomic_write(os.path.join(trace_dir, REQUEST), json.dumps(r.__dict__) + "\n")


def read_request(trace_dir: str) -> Request | None:
    """The current request, or None when absent or unreadable (never raises OSError)."""
    try:
        with open(os.path.join(trace_dir, REQUEST), encoding="utf-8") as f:
            d = json.load(f)
        return Request(
            id=str(d["id"]),
            start_iteration=int(d["start_iteration"]),
            iterations=int(d["iterations"]),
            reason=str(d.get("reason", "")),
            rank=int(d.get("rank", -1)),
            created_ns=int(d.get("created_ns", 0)),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def request_mtime_ns(trace_dir: str) -> int:
    try:
        return os.stat(os.path.join(trace_dir, REQUEST)).st_mtime_ns
    except OSError:
        return 0


def write_patterns(trace_dir: str, rank: int, lines: list[str]) -> str:
    path = os.path.join(trace_dir, f"functions.{rank}.jsonl")
    _atomic_write(path, "".join(lines))
    return path
