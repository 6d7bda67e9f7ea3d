"""Trigger PyTorch NCCL Flight Recorder dumps through the ranks' debug pipes and collect them.

PyTorch (``ProcessGroupNCCL.hpp`` ``DumpPipe``): when a rank runs with
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>`` and a trace buffer (``TORCH_NCCL_TRACE_BUFFER_SIZE``
> 0), it makes a FIFO ``<stem><rank>.pipe`` (``rank``: the global rank) and polls it; any byte
written makes it dump its trace to ``<prefix><rank>``, the prefix being
``TORCH_FR_DUMP_TEMP_FILE`` or the older ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (default
``/tmp/nccl_trace_rank_``). The paths are the container's: ``target`` prefixes them with a root
such as ``/proc/<pid>/root``. torch writes the dump in place, so a dump counts as collected once
the file changed since the poke and reads as a whole pickle (``frdump``, which never lets the
pickle build anything but plain containers).
"""

from __future__ import annotations

import errno
import os
import pathlib
import stat
import time
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from collscope.nodeagent import errors, frdump

PIPE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DEFAULT_DUMP_PREFIX = "/tmp/nccl_trace_rank_"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class Target(_Model):
    """Where to poke one rank and where its dump lands (paths as seen by the agent)."""

    rank: int
    pipe: pathlib.Path
    dump: pathlib.Path


class RankFailure(_Model):
    rank: int
    reason: str


class FlightRecorderReport(_Model):
    dumps: list[frdump.RankDump] = Field(default_factory=list)
    errors: list[RankFailure] = Field(default_factory=list)


# -- where -----------------------------------------------------------------------------------
def target(
    rank: int, environ: Mapping[str, str], *, root: pathlib.Path = pathlib.Path("/")
) -> Target | None:
    """The pipe and dump paths of ``rank`` from its process environment (``/proc/<pid>/
    environ``); None when the process has no debug pipe configured."""
    stem = environ.get(PIPE_ENV, "")
    if not stem:
        return None
    prefix = next((environ[k] for k in DUMP_ENVS if environ.get(k)), DEFAULT_DUMP_PREFIX)
    return Target(
        rank=rank,
        pipe=root / f"{stem}{rank}.pipe".lstrip("/"),
        dump=root / f"{prefix}{rank}".lstrip("/"),
    )


def environ_of(pid: int, *, proc_root: pathlib.Path = pathlib.Path("/proc")) -> dict[str, str]:
    """A process's environment as it started (``/proc/<pid>/environ``, NUL-separated)."""
    try:
        raw = (proc_root / str(pid) / "environ").read_bytes()
    except OSError as e:
        raise errors.FlightRecorderUnavailable(f"pid {pid}: environment: {e.strerror}") from e
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def target_of_pid(
    rank: int, pid: int, *, proc_root: pathlib.Path = pathlib.Path("/proc")
) -> Target | None:
    """``target`` for the training process ``pid`` (agent with ``hostPID``): its environment,
    and its paths seen through ``/proc/<pid>/root`` (the container's filesystem)."""
    return target(rank, environ_of(pid, proc_root=proc_root), root=proc_root / str(pid) / "root")


# -- trigger ---------------------------------------------------------------------------------
def poke(pipe: pathlib.Path) -> None:
    """Write one byte to a rank's debug pipe without ever blocking."""
    try:
        if not stat.S_ISFIFO(os.stat(pipe).st_mode):
            raise errors.FlightRecorderUnavailable(f"{pipe}: not a FIFO")
        # O_NONBLOCK: open fails with ENXIO instead of waiting when nobody reads the pipe.
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except FileNotFoundError as e:
        raise errors.FlightRecorderUnavailable(f"{pipe}: no debug pipe") from e
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise errors.FlightRecorderUnavailable(
                f"{pipe}: no reader (Flight Recorder off in this process, or it exited)"
            ) from e
        raise errors.FlightRecorderUnavailable(f"{pipe}: {e.strerror or e}") from e
    try:
        os.write(fd, b"1")
    except OSError as e:
        raise errors.FlightRecorderUnavailable(f"{pipe}: write: {e.strerror or e}") from e
    finally:
        os.close(fd)


def _stamp(path: pathlib.Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def trigger(
    targets: Sequence[Target],
    *,
    timeout_s: float = 10.0,
    poll_s: float = 0.05,
    max_bytes: int = frdump.MAX_DUMP_BYTES,
) -> FlightRecorderReport:
    """Poke every target's pipe, then collect each new dump (a file that changed since the
    poke and reads as a whole pickle) until ``timeout_s``; failures are per rank."""
    failures: dict[int, str] = {}
    before: dict[int, tuple[int, int, int] | None] = {}
    for t in targets:
        before[t.rank] = _stamp(t.dump)
        try:
            poke(t.pipe)
        except errors.FlightRecorderUnavailable as e:
            failures[t.rank] = str(e)
    pending = {t.rank: t for t in targets if t.rank not in failures}
    dumps: list[frdump.RankDump] = []
    last_error: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while pending:
        for rank, t in list(pending.items()):
            now = _stamp(t.dump)
            if now is None or now == before[rank]:
                continue
            try:
                dumps.append(frdump.read(t.dump, rank=rank, max_bytes=max_bytes))
                del pending[rank]
            except errors.FlightRecorderDumpInvalid as e:
                # Most likely still being written (torch writes in place): retry until the
                # deadline; only then is it an error.
                last_error[rank] = str(e)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    for rank, t in pending.items():
        failures[rank] = last_error.get(rank) or f"{t.dump}: no dump within {timeout_s:g} s"
    return FlightRecorderReport(
        dumps=sorted(dumps, key=lambda d: d.rank),
        errors=[RankFailure(rank=r, reason=failures[r]) for r in sorted(failures)],
    )


# -- trim ------------------------------------------------------------------------------------
def newest(report: FlightRecorderReport, max_entries: int) -> FlightRecorderReport:
    """``report`` with only the newest ``max_entries`` entries of each process group in each
    dump (torch appends entries in record order, so the last ones are the newest); the
    process groups' config and status stay whole."""
    dumps = []
    for d in report.dumps:
        seen: dict[int | None, int] = {}
        kept: list[frdump.Entry] = []
        for e in reversed(d.entries):
            n = seen.get(e.pg_id, 0)
            if n < max_entries:
                kept.append(e)
                seen[e.pg_id] = n + 1
        dumps.append(d.model_copy(update={"entries": kept[::-1]}))
    return report.model_copy(update={"dumps": dumps})
