"""Is a ring's writer still running? Its heartbeat, and its process as ``/proc`` shows it.

A hang has two very different kinds of cause. A NIC that stops delivering or a GPU that stops
producing leaves the training process alive: the plugin's heartbeat thread goes on refreshing
``header.heartbeat_ns`` every 100 ms (ring header §4). A process that was killed (SIGKILL, the
OOM killer), crashed, or was frozen (SIGSTOP, a debugger) stops beating with everything else
in it, and its peers then wait in the collective exactly as they would for a dead NIC. CCL-D's
probe (§4.1) and Mycroft's completion log (§4.2) both see only the collective side, which looks
the same in both cases; the heartbeat tells them apart, and ``/proc`` says which one it is:

- ``running``: the process exists and is not stopped;
- ``stopped``: ``T`` (SIGSTOP) or ``t`` (stopped by a tracer) in ``/proc/<pid>/stat``;
- ``dead``: no such process, a zombie (``Z``, killed and not yet reaped) or ``X``, or the pid
  now belongs to another process (started after the ring was, or another pid in its namespace);
- ``unknown``: the agent cannot tell (no host pid for the ring's writer, ``/proc`` unreadable).

The writer's pid is tenant input: only the host pid that ``Service.host_pid`` resolved for the
ring (``procs.host_pid``: the pod's cgroup when the pod is known) is looked at, and it is
re-checked against the ring (its innermost namespace pid, its start time) on every look, so a
recycled pid never speaks for a dead writer. Sample ``/proc/<pid>/stat`` (fields 3 and 22 are
read: the state and the start time in clock ticks after boot)::

    48213 (python3) T 48100 48213 48100 0 -1 4194560 ... 0 20 0 9 0 1733309 ...
"""

from __future__ import annotations

import os
import pathlib
from typing import Final, Literal

from collscope.nodeagent import procs
from collscope.nodeagent.bundle import models
from collscope.nodeagent.ring import livestate

ProcState = Literal["running", "stopped", "dead", "unknown"]
_NS = 1_000_000_000
# ``btime`` in /proc/stat has a resolution of one second and moves by up to a second when the
# kernel recomputes it, and a start time is counted in clock ticks (10 ms at 100 Hz): a process
# started more than 2 s after its ring was created cannot have created it.
START_SLACK_NS: Final = 2 * _NS
# Field 22 of /proc/<pid>/stat (starttime) is the 20th after the ")" that ends the comm.
_STARTTIME = 19


class ProcessProbe:
    """Reads the state of a host pid under ``proc_root`` (STYLE 10: tests pass a tree)."""

    def __init__(
        self, proc_root: pathlib.Path = pathlib.Path("/proc"), *, clock_ticks: int | None = None
    ) -> None:
        self.proc_root = proc_root
        self.clock_ticks = clock_ticks or os.sysconf("SC_CLK_TCK")
        self._boot_ns: int | None = None

    def state(self, host_pid: int, *, ns_pid: int, ring_init_ns: int) -> ProcState:
        """The state of ``host_pid`` if it is still the writer of a ring created at
        ``ring_init_ns`` whose header names ``ns_pid``; ``dead`` if it is gone or another
        process now."""
        try:
            text = (self.proc_root / str(host_pid) / "stat").read_text()
        except FileNotFoundError:
            return "dead"
        except OSError:  # hidepid, or not ours to read
            return "unknown"
        state, start_ticks = _parse_stat(text)
        if state is None:
            return "unknown"
        if state in "ZX":
            return "dead"
        chain = procs.nspid_chain(self.proc_root / str(host_pid) / "status")
        if chain and chain[-1] != ns_pid:
            return "dead"  # the pid was recycled by another process
        boot = self._boot()
        if boot is not None and start_ticks is not None:
            started = boot + start_ticks * _NS // self.clock_ticks
            if started > ring_init_ns + START_SLACK_NS:
                return "dead"  # recycled: this process started after the ring existed
        return "stopped" if state in "Tt" else "running"

    def _boot(self) -> int | None:
        if self._boot_ns is None:
            try:
                text = (self.proc_root / "stat").read_text()
            except OSError:
                return None
            for line in text.splitlines():
                if line.startswith("btime "):
                    try:
                        self._boot_ns = int(line.split()[1]) * _NS
                    except (IndexError, ValueError):
                        return None
                    break
        return self._boot_ns


def _parse_stat(text: str) -> tuple[str | None, int | None]:
    """(state letter, start time in clock ticks) of a ``/proc/<pid>/stat`` line."""
    end = text.rfind(")")
    fields = text[end + 1 :].split() if end >= 0 else []
    if not fields or len(fields[0]) != 1:
        return None, None
    try:
        start = int(fields[_STARTTIME]) if len(fields) > _STARTTIME else None
    except ValueError:
        start = None
    return fields[0], start


def record(
    rank: int,
    status: livestate.Status,
    *,
    observed_ns: int,
    process: ProcState,
    finalized: bool,
) -> models.LivenessRecord:
    """The ``liveness.jsonl`` line of one ring: its heartbeat as read at ``observed_ns`` and
    its writer's ``process`` state (``finalized``: every communicator was closed, so a writer
    gone since has ``exited``, not died)."""
    state: models.LivenessState = process
    if process == "dead" and finalized:
        state = "exited"
    beat = status.heartbeat_ns if status.heartbeat_ns > 0 else None
    return models.LivenessRecord(rank=rank, ts=observed_ns, state=state, heartbeat=beat)
