"""Dumps of PyTorch's NCCL Flight Recorder as JSON-ready models, unpickled safely.

The dump is a pickle written by the training process, i.e. untrusted input. It is unpickled
here only, in the agent, by an Unpickler that builds nothing but dicts, lists, tuples, str,
bytes, int, float, bool and None (plus torch's list markers ``torch.jit._pickle.build_*list``
and ``restore_type_tag``, mapped to a local identity function, never imported): any other
global is refused. The operator only ever sees the JSON of ``RankDump``. Shape read (FR
version "2.x", notes/kubernetes.md §6.3)::

    {"version": "2.5", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
     "pg_status": {"0": {"last_enqueued_collective": 7, "last_started_collective": 7,
                         "last_completed_collective": 6}},
     "entries": [{"record_id": 6, "pg_id": 0, "process_group": ("0", "default_pg"),
                  "collective_seq_id": 7, "p2p_seq_id": 0, "op_id": 7,
                  "profiling_name": "nccl:all_reduce", "time_created_ns": 17..., "state":
                  "started", "input_sizes": [[1024]], "output_sizes": [[1024]], ...}]}

Fields missing or of another type become None or empty (versions differ); only a top level
that is not a dict, or ``entries`` that is not a list, is an error.
"""

from __future__ import annotations

import io
import pathlib
import pickle
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from collscope.nodeagent import errors

# A trace of the default 2000 entries with stacks is a few MB; past this it is not a dump.
MAX_DUMP_BYTES = 64 << 20
_PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))


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


def _identity(value: Any, *_: Any) -> Any:
    return value


# torch's jit pickler marks typed lists with these globals; here they only return their input.
_ALLOWED_GLOBALS = {
    ("torch.jit._pickle", "build_intlist"): _identity,
    ("torch.jit._pickle", "build_doublelist"): _identity,
    ("torch.jit._pickle", "build_boollist"): _identity,
    ("torch.jit._pickle", "restore_type_tag"): _identity,
}


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        fn = _ALLOWED_GLOBALS.get((module, name))
        if fn is None:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return fn

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused persistent id (tensor data)")


def loads(data: bytes, *, file: str = "<bytes>") -> Any:
    """Unpickle ``data`` allowing plain containers only (see module docstring)."""
    try:
        obj = _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise errors.FlightRecorderDumpInvalid(file, f"not a plain pickle: {e}") from e
    except (IndexError, KeyError, MemoryError, RecursionError) as e:
        raise errors.FlightRecorderDumpInvalid(file, f"corrupt pickle: {type(e).__name__}") from e
    stack = [obj]  # iterative: a hostile pickle can nest deeper than Python recurses
    while stack:
        item = stack.pop()
        if not isinstance(item, _PLAIN):
            raise errors.FlightRecorderDumpInvalid(file, f"unexpected {type(item).__name__}")
        if isinstance(item, dict):
            stack += item.keys()
            stack += item.values()
        elif isinstance(item, list | tuple):
            stack += item
    return obj


def read(path: pathlib.Path, *, rank: int, max_bytes: int = MAX_DUMP_BYTES) -> RankDump:
    """Read and convert one dump file."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise errors.FlightRecorderDumpInvalid(str(path), e.strerror or str(e)) from e
    if len(data) > max_bytes:
        raise errors.FlightRecorderDumpInvalid(str(path), f"larger than {max_bytes} bytes")
    return convert(loads(data, file=str(path)), rank=rank, file=str(path))


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _sizes(v: Any) -> list[list[int]]:
    if not isinstance(v, list | tuple):
        return []
    return [[int(x) for x in s if _int(x) is not None] for s in v if isinstance(s, list | tuple)]


def _strs(v: Any) -> list[str]:
    return [str(x) for x in v] if isinstance(v, list | tuple) else []


def _ranks(v: Any) -> list[int]:
    if isinstance(v, str):  # torch writes "[0, 1, 2]"
        return [int(x) for x in re.findall(r"-?\d+", v)]
    return [i for i in (_int(x) for x in v) if i is not None] if isinstance(v, list | tuple) else []


def _entry(e: dict[Any, Any]) -> Entry:
    pg = e.get("process_group")
    pg_name, pg_desc = (
        (str(pg[0]), str(pg[1])) if isinstance(pg, list | tuple) and len(pg) == 2 else ("", "")
    )
    return Entry(
        record_id=_int(e.get("record_id")),
        pg_id=_int(e.get("pg_id")),
        pg_name=pg_name,
        pg_desc=pg_desc,
        collective_seq_id=_int(e.get("collective_seq_id")),
        p2p_seq_id=_int(e.get("p2p_seq_id")),
        op_id=_int(e.get("op_id")),
        profiling_name=str(e.get("profiling_name") or ""),
        state=str(e.get("state") or ""),
        time_created_ns=_int(e.get("time_created_ns")),
        time_discovered_started_ns=_int(e.get("time_discovered_started_ns")),
        time_discovered_completed_ns=_int(e.get("time_discovered_completed_ns")),
        duration_ms=_float(e.get("duration")),
        timeout_ms=_int(e.get("timeout_ms")),
        is_p2p=_bool(e.get("is_p2p")),
        retired=_bool(e.get("retired")),
        input_sizes=_sizes(e.get("input_sizes")),
        output_sizes=_sizes(e.get("output_sizes")),
        input_dtypes=_strs(e.get("input_dtypes")),
        output_dtypes=_strs(e.get("output_dtypes")),
    )


def convert(obj: Any, *, rank: int, file: str) -> RankDump:
    """The fields analysis needs, from an unpickled dump (see the shape above)."""
    if not isinstance(obj, dict):
        raise errors.FlightRecorderDumpInvalid(file, f"top level is {type(obj).__name__}, not dict")
    entries = obj.get("entries", [])
    if not isinstance(entries, list | tuple):
        raise errors.FlightRecorderDumpInvalid(file, "'entries' is not a list")
    config = obj.get("pg_config") or {}
    status = obj.get("pg_status") or {}
    return RankDump(
        rank=rank,
        file=file,
        version=str(obj.get("version", "")),
        pg_config=[
            PgInfo(
                id=str(k),
                name=str(v.get("name", "")),
                desc=str(v.get("desc", "")),
                ranks=_ranks(v.get("ranks")),
            )
            for k, v in (config.items() if isinstance(config, dict) else [])
            if isinstance(v, dict)
        ],
        pg_status=[
            PgStatus(
                id=str(k),
                last_enqueued_collective=_int(v.get("last_enqueued_collective")),
                last_started_collective=_int(v.get("last_started_collective")),
                last_completed_collective=_int(v.get("last_completed_collective")),
            )
            for k, v in (status.items() if isinstance(status, dict) else [])
            if isinstance(v, dict)
        ],
        entries=[_entry(e) for e in entries if isinstance(e, dict)],
    )
