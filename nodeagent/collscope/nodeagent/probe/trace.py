"""torch.profiler's Chrome trace (what ``export_chrome_trace`` writes) as ``summarise.Event``.

Times: ``ts``/``dur`` are µs on the profiler's clock; ``baseTimeNanoseconds`` + ts x 1000 is
the Unix time in ns (Kineto's convention), which the CPU samples use. Categories: ``kernel``
(``nccl`` in the name: ``comm``), ``gpu_memcpy``/``gpu_memset`` (``memory``), ``cpu_op``
(ATen operators: ``memory`` for pin/copy/allocation operators, else ``python``: CPU work under
a Python function), ``python_function`` (``python``). The probe's and the profiler's own frames
are left out, and object addresses are cut from names so that one function has one name on
every worker.
"""

from __future__ import annotations

import json
import re
from typing import Any

from collscope.nodeagent.probe import summarise

_MEMORY_OPS = ("pin_memory", "aten::copy_", "aten::to", "aten::_to_copy", "aten::empty")
_ADDRESS = re.compile(
    r" at 0x[0-9a-fA-F]+"
)  # "<built-in method add_ of Parameter object at 0x7f..>"
_SKIP = ("torch/profiler/", "collscope/nodeagent/probe/", "threading.py")


def _kind(cat: str, name: str) -> str | None:
    if cat == "kernel":
        return "comm" if "nccl" in name.lower() else "kernel"
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memory"
    if cat == "cpu_op":
        return "memory" if any(m in name for m in _MEMORY_OPS) else "python"
    if cat == "python_function":
        return "python"
    return None


def events(doc: dict[str, Any]) -> list[summarise.Event]:
    base = int(doc.get("baseTimeNanoseconds", 0))
    out = []
    for e in doc.get("traceEvents", []):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        name = _ADDRESS.sub("", str(e.get("name", "")))
        kind = _kind(str(e.get("cat", "")), name)
        if kind is None or any(s in name for s in _SKIP):
            continue
        try:
            start = base + int(float(e["ts"]) * 1000)
            end = start + int(float(e.get("dur", 0)) * 1000)
            tid = int(e.get("tid", 0))
        except (KeyError, TypeError, ValueError):  # not a complete event: skip it
            continue
        out.append(summarise.Event(name, kind, start, end, tid))
    return out


def load(path: str) -> list[summarise.Event]:
    with open(path, encoding="utf-8") as f:
        return events(json.load(f))
