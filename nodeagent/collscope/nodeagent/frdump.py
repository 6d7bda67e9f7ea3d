"""Dumps of PyTorch's NCCL Flight Recorder as JSON-ready models, parsed under limits.

The dump is a pickle written by the training process, i.e. untrusted input. ``frpickle``
unpickles it with an Unpickler that builds plain containers only; ``parse`` runs it in a child
interpreter under ``RLIMIT_AS`` and ``RLIMIT_CPU`` and kills it at a wall-clock deadline
(``ParseLimits``), so a pickle bomb costs one rank's error, never the agent's CPU or memory.
The operator only ever sees the JSON of ``RankDump``. Shape read (FR version "2.x",
notes/kubernetes.md §6.3)::

    {"version": "2.5", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
     "pg_status": {"0": {"last_enqueued_collective": 7, "last_started_collective": 7,
                         "last_completed_collective": 6}},
     "entries": [{"record_id": 6, "pg_id": 0, "process_group": ("0", "default_pg"),
                  "collective_seq_id": 7, "p2p_seq_id": 0, "op_id": 7,
                  "profiling_name": "nccl:all_reduce", "time_created_ns": 17..., "state":
                  "started", "input_sizes": [[1024]], "output_sizes": [[1024]], ...}]}

Fields missing or of another type become None or empty (versions differ); only a top level
that is not a dict, or ``entries`` that is not a list, is an error.

Cost: the child interpreter (``-I -S``, stdlib only) starts in ~20 ms. A 3.9 MB dump of 2,000
entries with 20-frame stacks (torch's usual buffer) took 0.20 s to read and convert in-process
before the child, 0.25 s through it (median of 7, 2-core dev machine).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from collscope.nodeagent import errors, frpickle, rootfs

# A trace of the default 2000 entries with stacks is a few MB; past this it is not a dump.
MAX_DUMP_BYTES = 64 << 20
# The child's JSON answer: without stacks a dump converts to about a third of its pickle.
MAX_OUTPUT_BYTES = 64 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class ParseLimits:
    """What parsing one dump may cost; past any limit the dump is that rank's error."""

    # Wall clock from start to answer; a 3.9 MB dump takes ~0.2 s on one core.
    timeout_s: float = 5.0
    # The child's address space (RLIMIT_AS): the interpreter's ~30 MB plus a dump's objects
    # (~10x its pickle); two children at once stay well inside the agent's 1 GiB limit.
    memory_bytes: int = 384 << 20
    # Children at once across all requests (the agent's CPU limit is one core).
    parallel: int = 2


DEFAULT_LIMITS = ParseLimits()


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class PgInfo(_Model):
    id: str
    name: str = ""
    desc: str = ""
    ranks: list[int] = Field(default_factory=list)


class PgStatus(_Model):
    id: str
    last_enqueued_collective: int | None = None
    last_started_collective: int | None = None
    last_completed_collective: int | None = None


class Entry(_Model):
    """One collective or p2p operation in the rank's trace buffer."""

    record_id: int | None = None
    pg_id: int | None = None
    pg_name: str = ""
    pg_desc: str = ""
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    op_id: int | None = None
    profiling_name: str = ""
    state: str = ""
    time_created_ns: int | None = None
    time_discovered_started_ns: int | None = None
    time_discovered_completed_ns: int | None = None
    duration_ms: float | None = None
    timeout_ms: int | None = None
    is_p2p: bool | None = None
    retired: bool | None = None
    input_sizes: list[list[int]] = Field(default_factory=list)
    output_sizes: list[list[int]] = Field(default_factory=list)
    input_dtypes: list[str] = Field(default_factory=list)
    output_dtypes: list[str] = Field(default_factory=list)


class RankDump(_Model):
    rank: int
    file: str
    version: str = ""
    pg_config: list[PgInfo] = Field(default_factory=list)
    pg_status: list[PgStatus] = Field(default_factory=list)
    entries: list[Entry] = Field(default_factory=list)
    # The dump file byte for byte as it was parsed (``read``), kept for a request that asks
    # for it (``flightrecorder.exported``); never serialised itself.
    raw: bytes | None = Field(default=None, exclude=True, repr=False)
    # Only in answers to ``raw`` requests: the file in base64, or why it is left out.
    raw_b64: str | None = None
    raw_omitted: str = ""


def loads(data: bytes, *, file: str = "<bytes>") -> Any:
    """Unpickle ``data`` in this process, plain containers only (tests; the agent uses
    ``parse``)."""
    try:
        return frpickle.loads(data)
    except frpickle.InvalidDumpError as e:
        raise errors.FlightRecorderDumpInvalid(file, str(e)) from e


def convert(obj: Any, *, rank: int, file: str) -> RankDump:
    """The fields analysis needs, from an unpickled dump (see the shape above)."""
    try:
        fields = frpickle.plain(obj)
    except frpickle.InvalidDumpError as e:
        raise errors.FlightRecorderDumpInvalid(file, str(e)) from e
    return _model(fields, rank=rank, file=file)


def _model(fields: Any, *, rank: int, file: str) -> RankDump:
    if not isinstance(fields, dict):
        raise errors.FlightRecorderDumpInvalid(file, "parser answered no fields")
    try:
        return RankDump.model_validate({**fields, "rank": rank, "file": file})
    except pydantic.ValidationError as e:
        raise errors.FlightRecorderDumpInvalid(file, f"unexpected fields: {e}") from e


class Parser:
    """Parses dumps in limited children, at most ``limits.parallel`` at once (one ``Parser``
    per agent, shared by its requests)."""

    def __init__(self, limits: ParseLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._slots = threading.BoundedSemaphore(limits.parallel)

    def parse(
        self, data: bytes, *, rank: int, file: str, timeout_s: float | None = None
    ) -> RankDump:
        """``data`` as a ``RankDump``; ``FlightRecorderDumpInvalid`` for a bad, too costly or
        too slow dump. ``timeout_s`` (at most the limit's) covers the wait for a slot too."""
        limit = (
            self.limits.timeout_s if timeout_s is None else min(timeout_s, self.limits.timeout_s)
        )
        deadline = time.monotonic() + limit
        if not self._slots.acquire(timeout=limit):
            raise errors.FlightRecorderDumpInvalid(file, f"parser busy for {limit:g} s")
        try:
            return self._run(
                data, rank=rank, file=file, timeout_s=max(0.0, deadline - time.monotonic())
            )
        finally:
            self._slots.release()

    def _run(self, data: bytes, *, rank: int, file: str, timeout_s: float) -> RankDump:
        lim = self.limits
        limits = (lim.memory_bytes, math.ceil(timeout_s) + 1, MAX_OUTPUT_BYTES)
        cmd = [sys.executable, "-I", "-S", frpickle.__file__, *map(str, limits)]
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={},
                close_fds=True,
            )
        except OSError as e:
            raise errors.FlightRecorderDumpInvalid(file, f"cannot start the parser: {e}") from e
        try:
            out, err = proc.communicate(data, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            proc.kill()
            proc.communicate()
            raise errors.FlightRecorderDumpInvalid(
                file, f"parse took longer than {timeout_s:.3g} s (killed)"
            ) from e
        if proc.returncode != 0 or not out:
            raise errors.FlightRecorderDumpInvalid(file, _death(proc.returncode, err, lim))
        try:
            answer = json.loads(out)
        except ValueError as e:
            raise errors.FlightRecorderDumpInvalid(file, "unreadable parser answer") from e
        if not isinstance(answer, dict) or "dump" not in answer:
            reason = answer.get("error") if isinstance(answer, dict) else None
            raise errors.FlightRecorderDumpInvalid(file, str(reason or "parser gave no dump"))
        return _model(answer["dump"], rank=rank, file=file)


def _death(rc: int | None, stderr: bytes, lim: ParseLimits) -> str:
    if rc is not None and rc < 0:
        sig = -rc
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return f"parse over its CPU limit (signal {signal.Signals(sig).name}, killed)"
        return f"parser killed by signal {signal.Signals(sig).name}"
    tail = " ".join(stderr.decode(errors="replace").split())[-200:]
    if "MemoryError" in tail:
        return f"over the parser's memory limit ({lim.memory_bytes >> 20} MiB)"
    return f"parser exited with {rc}: {tail or 'no message'}"


def read(
    path: str,
    *,
    rank: int,
    root: pathlib.Path = pathlib.Path("/"),
    max_bytes: int = MAX_DUMP_BYTES,
    parser: Parser | None = None,
    timeout_s: float | None = None,
) -> RankDump:
    """Read one dump file inside ``root`` (never through a symlink as its last component, never
    out of ``root``, only a regular file, at most ``max_bytes``) and parse it under limits;
    the bytes parsed stay in ``RankDump.raw``."""
    file = _shown(root, path)
    try:
        data = rootfs.read_regular(root, path, max_bytes=max_bytes)
    except OSError as e:
        raise errors.FlightRecorderDumpInvalid(file, e.strerror or str(e)) from e
    dump = (parser or Parser()).parse(data, rank=rank, file=file, timeout_s=timeout_s)
    return dump.model_copy(update={"raw": data})


def _shown(root: pathlib.Path, path: str) -> str:
    return str(root / path.lstrip("/"))
