"""Trigger PyTorch NCCL Flight Recorder dumps through the ranks' debug pipes and collect them.

PyTorch (``ProcessGroupNCCL.hpp`` ``DumpPipe``): when a rank runs with
``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=<stem>`` and a trace buffer (``TORCH_NCCL_TRACE_BUFFER_SIZE``
> 0), it makes a FIFO ``<stem><rank>.pipe`` (``rank``: the global rank) and polls it; any byte
written makes it dump its trace to ``<prefix><rank>``, the prefix being
``TORCH_FR_DUMP_TEMP_FILE`` or the older ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, by default
``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_``, ``$XDG_CACHE_HOME`` defaulting to
``$HOME/.cache`` and ``$HOME`` to ``/tmp`` (``DebugInfoWriter::getWriter``; its strings are in
torch 2.13's ``libtorch_cpu.so``; older torch wrote ``/tmp/nccl_trace_rank_``, which a pod of
older torch now has to name in ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``). The paths are the
container's, taken from its environment, and everything along them is the tenant's: they are
resolved inside the container's root (``/proc/<pid>/root``) by ``rootfs`` (never through a
symlink as last component, never out of the root, the pipe only if a FIFO, the dump only if a
regular file, without blocking, size capped). torch writes the dump in place, so a dump counts
as collected once the file changed since the poke and parses as a whole pickle (``frdump``:
plain containers only, in a child under CPU, memory and time limits). Every failure is one
rank's: the other ranks' dumps still come back. A request with ``raw`` also gets each file as
it was parsed, unchanged, in base64 (``exported``; ``RAW_MAX_BYTES`` per answer), for torch's
own ``torch.distributed.flight_recorder`` (``collscope flightrecorder`` writes them out). It
is the same endpoint and the same right (``create agents/flightrecorder``): the files hold
what the parsed answer leaves out, such as each entry's Python stack.
"""

from __future__ import annotations

import base64
import errno
import os
import pathlib
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures

from pydantic import BaseModel, ConfigDict, Field

from collscope.nodeagent import errors, frdump, rootfs

PIPE_ENV = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DUMP_FILE_STEM = "torch/comm_lib_trace_rank_"  # under the cache directory
# Raw dump bytes held per request, all ranks together: a dump of torch's default 2,000 entries
# with stacks is ~4 MB, so 8 ranks of a node fit; 43 MiB of base64 in the answer at most.
RAW_MAX_BYTES = 32 << 20


def default_dump_prefix(environ: Mapping[str, str]) -> str:
    """torch's own dump prefix for a process with ``environ`` and neither ``DUMP_ENVS`` set."""
    cache = environ.get("XDG_CACHE_HOME") or f"{environ.get('HOME') or '/tmp'}/.cache"
    return f"{cache.rstrip('/')}/{DUMP_FILE_STEM}"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class Target(_Model):
    """Where to poke one rank and where its dump lands: ``pipe`` and ``dump`` are the
    container's paths, resolved inside ``root`` (``/proc/<pid>/root``; ``/`` for a process
    of the agent's own filesystem)."""

    rank: int
    root: pathlib.Path = pathlib.Path("/")
    pipe: str
    dump: str

    def shown(self, path: str) -> str:
        """``path`` as the agent sees it, for messages."""
        return str(self.root / path.lstrip("/"))


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
    prefix = next((environ[k] for k in DUMP_ENVS if environ.get(k)), None)
    prefix = prefix or default_dump_prefix(environ)
    return Target(rank=rank, root=root, pipe=f"{stem}{rank}.pipe", dump=f"{prefix}{rank}")


# -- trigger ---------------------------------------------------------------------------------
def poke(t: Target) -> None:
    """Write one byte to a rank's debug pipe without ever blocking (and only to a FIFO)."""
    shown = t.shown(t.pipe)
    try:
        # O_NONBLOCK: open fails with ENXIO instead of waiting when nobody reads the pipe.
        fd = rootfs.open_file(t.root, t.pipe, os.O_WRONLY, want=stat.S_ISFIFO, kind="a FIFO")
    except FileNotFoundError as e:
        raise errors.FlightRecorderUnavailable(f"{shown}: no debug pipe") from e
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise errors.FlightRecorderUnavailable(
                f"{shown}: no reader (Flight Recorder off in this process, or it exited)"
            ) from e
        raise errors.FlightRecorderUnavailable(f"{shown}: {e.strerror or e}") from e
    try:
        os.write(fd, b"1")
    except OSError as e:
        raise errors.FlightRecorderUnavailable(f"{shown}: write: {e.strerror or e}") from e
    finally:
        os.close(fd)


def _stamp(t: Target) -> tuple[int, int, int] | None:
    try:
        st = rootfs.lstat(t.root, t.dump)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def trigger(
    targets: Sequence[Target],
    *,
    timeout_s: float = 10.0,
    poll_s: float = 0.05,
    max_bytes: int = frdump.MAX_DUMP_BYTES,
    parser: frdump.Parser | None = None,
    raw_max_bytes: int = RAW_MAX_BYTES,
) -> FlightRecorderReport:
    """Poke every target's pipe, then collect each new dump (a file that changed since the
    poke and parses as a whole pickle) until ``timeout_s``; failures are per rank. Changed
    dumps are parsed concurrently, each at most once per change, under ``parser``'s limits.
    The files' bytes stay in ``RankDump.raw`` as they arrive, up to ``raw_max_bytes`` in
    all; a later one past it has ``raw_omitted`` instead."""
    parser = parser or frdump.Parser()
    raw_left = raw_max_bytes
    failures: dict[int, str] = {}
    before: dict[int, tuple[int, int, int] | None] = {}
    for t in targets:
        before[t.rank] = _stamp(t)
        try:
            poke(t)
        except errors.FlightRecorderUnavailable as e:
            failures[t.rank] = str(e)
    pending = {t.rank: t for t in targets if t.rank not in failures}
    tried = dict(before)  # the stamp of the last version tried per rank
    dumps: list[frdump.RankDump] = []
    last_error: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    with futures.ThreadPoolExecutor(max_workers=parser.limits.parallel) as pool:
        while pending:
            changed = {}
            for rank, t in pending.items():
                now = _stamp(t)
                if now is not None and now != tried[rank]:
                    tried[rank] = now
                    changed[rank] = t
            left = max(deadline - time.monotonic(), MIN_PARSE_S)
            jobs = {
                r: pool.submit(_collect, t, parser, max_bytes, left) for r, t in changed.items()
            }
            for rank, job in jobs.items():
                result = job.result()
                if isinstance(result, str):
                    # Most likely still being written (torch writes in place): retried once
                    # it changes again, until the deadline; only then is it an error.
                    last_error[rank] = result
                else:
                    result, raw_left = _raw_within(result, raw_left, raw_max_bytes)
                    dumps.append(result)
                    del pending[rank]
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(poll_s)
    for rank, t in pending.items():
        failures[rank] = (
            last_error.get(rank) or f"{t.shown(t.dump)}: no dump within {timeout_s:g} s"
        )
    return FlightRecorderReport(
        dumps=sorted(dumps, key=lambda d: d.rank),
        errors=[RankFailure(rank=r, reason=failures[r]) for r in sorted(failures)],
    )


# A dump found just before the request's deadline still gets this long to parse.
MIN_PARSE_S = 1.0


def _raw_within(d: frdump.RankDump, left: int, cap: int) -> tuple[frdump.RankDump, int]:
    """``d`` with its raw bytes when they fit in ``left``, else without, saying why."""
    if d.raw is None:
        return d, left
    if len(d.raw) <= left:
        return d, left - len(d.raw)
    why = f"{len(d.raw)} bytes, over what is left of the {cap >> 20} MiB of raw dumps per answer"
    return d.model_copy(update={"raw": None, "raw_omitted": f"{why}: ask for fewer ranks"}), left


def _collect(
    t: Target, parser: frdump.Parser, max_bytes: int, timeout_s: float
) -> frdump.RankDump | str:
    """One rank's dump, or why not; never raises (one rank's failure is not the request's)."""
    try:
        return frdump.read(
            t.dump,
            rank=t.rank,
            root=t.root,
            max_bytes=max_bytes,
            parser=parser,
            timeout_s=timeout_s,
        )
    except errors.FlightRecorderDumpInvalid as e:
        return str(e)
    except Exception as e:  # a bug here must still cost one rank only
        return f"{t.shown(t.dump)}: {type(e).__name__}: {e}"


# -- who -----------------------------------------------------------------------------------
RankDumper = Callable[[Sequence[tuple[int, int]], float], FlightRecorderReport]


def guarded(dumper: RankDumper, refusal: Callable[[int], str | None]) -> RankDumper:
    """``dumper`` called with the ``(rank, host pid)`` pairs whose pid ``refusal`` accepts
    (``procs.TrainingProcesses``); each refused pair is that rank's failure, with the reason,
    and its process is never touched."""

    def dump(targets: Sequence[tuple[int, int]], timeout_s: float) -> FlightRecorderReport:
        refused = [
            RankFailure(rank=rank, reason=f"pid {pid}: {reason}")
            for rank, pid in targets
            if (reason := refusal(pid)) is not None
        ]
        gone = {f.rank for f in refused}
        allowed = [(rank, pid) for rank, pid in targets if rank not in gone]
        report = dumper(allowed, timeout_s) if allowed else FlightRecorderReport()
        errs = sorted([*report.errors, *refused], key=lambda f: f.rank)
        return report.model_copy(update={"errors": errs})

    return dump


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


# -- export ----------------------------------------------------------------------------------
def exported(report: FlightRecorderReport) -> FlightRecorderReport:
    """``report`` for a ``raw`` request: each dump's file in base64 (``raw_b64``), unchanged,
    for torch's own tools, or ``raw_omitted`` saying why not."""
    dumps = []
    for d in report.dumps:
        if d.raw is not None:
            upd = {"raw": None, "raw_b64": base64.b64encode(d.raw).decode("ascii")}
        else:
            upd = {"raw_omitted": d.raw_omitted or "the agent kept no copy of this dump"}
        dumps.append(d.model_copy(update=upd))
    return report.model_copy(update={"dumps": dumps})
