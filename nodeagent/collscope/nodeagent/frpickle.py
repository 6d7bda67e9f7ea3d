"""Unpickles one Flight Recorder dump into plain JSON-ready fields; run as a limited child.

The dump is a pickle written by the training process: untrusted input. Two defences:

1. What it may build: an Unpickler that makes nothing but dicts, lists, tuples, str, bytes,
   int, float, bool and None (plus torch's list markers ``torch.jit._pickle.build_*list`` and
   ``restore_type_tag``, mapped to an identity function, never imported); any other global and
   any persistent id (tensor storage) is refused.
2. What it may cost: plain containers can still share references, so 12 KB of pickle can stand
   for 10^30 list items (a "billion laughs"), and converting it would run forever. ``frdump``
   therefore runs this module as a script in a child interpreter (``python -I -S``: no site,
   no environment) that first limits itself (``RLIMIT_AS``, ``RLIMIT_CPU``, no files, no core),
   then reads the dump on stdin and writes one JSON line on stdout::

       {"dump": {"version": "2.5", "pg_config": [...], "pg_status": [...], "entries": [...]}}
       {"error": "not a plain pickle: refused global os.system"}

   and the parent kills it at a wall-clock deadline. Hence stdlib only, no collscope import:
   this file must run alone. The shape read is in ``frdump``'s docstring.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
import resource
import sys
from typing import Any

_PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))
# Integers outside int64 are not counters or timestamps: dropped, not carried as huge JSON.
_INT_MAX = (1 << 63) - 1


class InvalidDumpError(ValueError):
    """The dump is not a plain pickle in the documented shape (``frdump`` translates it)."""


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


def loads(data: bytes) -> Any:
    """Unpickle ``data`` allowing plain containers only (see module docstring)."""
    try:
        obj = _PlainUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise InvalidDumpError(f"not a plain pickle: {e}") from e
    except (IndexError, KeyError, MemoryError, RecursionError) as e:
        raise InvalidDumpError(f"corrupt pickle: {type(e).__name__}") from e
    stack = [obj]  # iterative: a hostile pickle can nest deeper than Python recurses
    seen: set[int] = set()  # each container once: shared references cost nothing here
    while stack:
        item = stack.pop()
        if not isinstance(item, _PLAIN):
            raise InvalidDumpError(f"unexpected {type(item).__name__}")
        if isinstance(item, dict | list | tuple):
            if id(item) in seen:
                continue
            seen.add(id(item))
            if isinstance(item, dict):
                stack += item.keys()
                stack += item.values()
            else:
                stack += item
    return obj


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        i = int(v)
    except (TypeError, ValueError, OverflowError):  # also str past int_max_str_digits
        return None
    return i if -_INT_MAX <= i <= _INT_MAX else None


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None  # JSON has no NaN or infinity


def _bool(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool | float) or (isinstance(v, int) and _int(v) is not None):
        return str(v)
    return ""


def _sizes(v: Any) -> list[list[int]]:
    if not isinstance(v, list | tuple):
        return []
    return [
        [i for i in (_int(x) for x in s) if i is not None] for s in v if isinstance(s, list | tuple)
    ]


def _strs(v: Any) -> list[str]:
    return [_text(x) for x in v] if isinstance(v, list | tuple) else []


def _ranks(v: Any) -> list[int]:
    if isinstance(v, str):  # torch writes "[0, 1, 2]"
        v = re.findall(r"-?\d+", v)
    if not isinstance(v, list | tuple):
        return []
    return [i for i in (_int(x) for x in v) if i is not None]


def _entry(e: dict[Any, Any]) -> dict[str, Any]:
    pg = e.get("process_group")
    if not (isinstance(pg, list | tuple) and len(pg) == 2):
        pg = ("", "")
    return {
        "record_id": _int(e.get("record_id")),
        "pg_id": _int(e.get("pg_id")),
        "pg_name": _text(pg[0]),
        "pg_desc": _text(pg[1]),
        "collective_seq_id": _int(e.get("collective_seq_id")),
        "p2p_seq_id": _int(e.get("p2p_seq_id")),
        "op_id": _int(e.get("op_id")),
        "profiling_name": _text(e.get("profiling_name")),
        "state": _text(e.get("state")),
        "time_created_ns": _int(e.get("time_created_ns")),
        "time_discovered_started_ns": _int(e.get("time_discovered_started_ns")),
        "time_discovered_completed_ns": _int(e.get("time_discovered_completed_ns")),
        "duration_ms": _float(e.get("duration")),
        "timeout_ms": _int(e.get("timeout_ms")),
        "is_p2p": _bool(e.get("is_p2p")),
        "retired": _bool(e.get("retired")),
        "input_sizes": _sizes(e.get("input_sizes")),
        "output_sizes": _sizes(e.get("output_sizes")),
        "input_dtypes": _strs(e.get("input_dtypes")),
        "output_dtypes": _strs(e.get("output_dtypes")),
    }


def plain(obj: Any) -> dict[str, Any]:
    """The fields analysis needs, from an unpickled dump, as JSON-ready values; fields missing
    or of another type become None or empty (versions differ)."""
    if not isinstance(obj, dict):
        raise InvalidDumpError(f"top level is {type(obj).__name__}, not dict")
    entries = obj.get("entries", [])
    if not isinstance(entries, list | tuple):
        raise InvalidDumpError("'entries' is not a list")
    config = obj.get("pg_config") or {}
    status = obj.get("pg_status") or {}
    return {
        "version": _text(obj.get("version", "")),
        "pg_config": [
            {
                "id": _text(k),
                "name": _text(v.get("name", "")),
                "desc": _text(v.get("desc", "")),
                "ranks": _ranks(v.get("ranks")),
            }
            for k, v in (config.items() if isinstance(config, dict) else [])
            if isinstance(v, dict)
        ],
        "pg_status": [
            {
                "id": _text(k),
                "last_enqueued_collective": _int(v.get("last_enqueued_collective")),
                "last_started_collective": _int(v.get("last_started_collective")),
                "last_completed_collective": _int(v.get("last_completed_collective")),
            }
            for k, v in (status.items() if isinstance(status, dict) else [])
            if isinstance(v, dict)
        ],
        "entries": [_entry(e) for e in entries if isinstance(e, dict)],
    }


def main(argv: list[str]) -> int:
    """``frpickle.py MEMORY_BYTES CPU_S MAX_OUTPUT_BYTES``: limits, stdin, one JSON line."""
    memory, cpu_s, max_out = (int(a) for a in argv)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))  # SIGXCPU, then SIGKILL
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        out = json.dumps({"dump": plain(loads(sys.stdin.buffer.read()))}, separators=(",", ":"))
    except InvalidDumpError as e:
        out = json.dumps({"error": str(e)})
    except MemoryError:
        out = json.dumps({"error": f"over the parser's memory limit ({memory >> 20} MiB)"})
    except Exception as e:  # any other failure is this dump's, reported as such
        out = json.dumps({"error": f"cannot convert: {type(e).__name__}: {e}"[:400]})
    if len(out) > max_out:
        out = json.dumps({"error": f"converted dump larger than {max_out} bytes"})
    sys.stdout.write(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
