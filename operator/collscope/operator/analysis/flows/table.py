"""Network flows in columnar form: the input of black-box analysis (LLMPrism §II-B).

One row per line of ``flows.jsonl`` (docs/spec/bundle-v1.md), sample::

    {"ts": 1767225660123456000, "src": "10.0.3.1", "dst": "10.0.7.1", "bytes": 8388608,
     "duration": 212000, "switches": ["leaf-00", "spine-03", "leaf-01"]}

Endpoint ids and switch names are interned (``endpoints[i]``, ``switches[j]``); the switches on
a flow's path are a CSR list: ``sw_idx[sw_ptr[i]:sw_ptr[i + 1]]``. Rows are sorted by start
time, so a time window is two binary searches. Shapes: every per-flow array is ``[n]``,
``sw_ptr`` is ``[n + 1]``, ``sw_idx`` ``[sw_ptr[n]]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import models, tables

IntArray = npt.NDArray[np.int64]
I32Array = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FlowTable:
    """Flows sorted by start time (ns); endpoint and switch names interned."""

    endpoints: tuple[str, ...]
    switches: tuple[str, ...]
    src: I32Array
    dst: I32Array
    ts: IntArray
    nbytes: IntArray
    duration: IntArray
    sw_ptr: IntArray
    sw_idx: I32Array

    def __len__(self) -> int:
        return len(self.ts)

    @property
    def end(self) -> IntArray:
        """When each flow ended (ns)."""
        return self.ts + self.duration

    def time_span(self) -> tuple[int, int] | None:
        """(first start, last end) in ns, or None when empty."""
        if not len(self):
            return None
        return int(self.ts[0]), int(self.end.max())

    @classmethod
    def from_flows(cls, flows: Iterable[models.NetFlow]) -> FlowTable:
        """Intern and sort the flows of ``flows.jsonl`` (e.g. ``reader.iter_net_flows``)."""
        eps: dict[str, int] = {}
        sws: dict[str, int] = {}
        src: list[int] = []
        dst: list[int] = []
        ts: list[int] = []
        nb: list[int] = []
        du: list[int] = []
        ptr = [0]
        sw: list[int] = []
        for f in flows:
            src.append(eps.setdefault(f.src, len(eps)))
            dst.append(eps.setdefault(f.dst, len(eps)))
            ts.append(f.ts)
            nb.append(f.bytes)
            du.append(f.duration)
            for name in f.switches:
                sw.append(sws.setdefault(name, len(sws)))
            ptr.append(len(sw))
        return cls.from_columns(
            endpoints=tuple(eps),
            src=np.array(src, dtype=np.int32),
            dst=np.array(dst, dtype=np.int32),
            ts=np.array(ts, dtype=np.int64),
            nbytes=np.array(nb, dtype=np.int64),
            duration=np.array(du, dtype=np.int64),
            switches=tuple(sws),
            sw_ptr=np.array(ptr, dtype=np.int64),
            sw_idx=np.array(sw, dtype=np.int32),
        )

    @classmethod
    def from_columns(
        cls,
        *,
        endpoints: Sequence[str],
        src: npt.ArrayLike,
        dst: npt.ArrayLike,
        ts: npt.ArrayLike,
        nbytes: npt.ArrayLike,
        duration: npt.ArrayLike,
        switches: Sequence[str] = (),
        sw_ptr: npt.ArrayLike | None = None,
        sw_idx: npt.ArrayLike | None = None,
    ) -> FlowTable:
        """A table from plain arrays (simulator, tests), sorted by start time here."""
        ts_a = np.asarray(ts, dtype=np.int64)
        n = len(ts_a)
        ptr = np.zeros(n + 1, dtype=np.int64) if sw_ptr is None else np.asarray(sw_ptr, np.int64)
        idx = np.zeros(0, dtype=np.int32) if sw_idx is None else np.asarray(sw_idx, np.int32)
        table = cls(
            endpoints=tuple(endpoints),
            switches=tuple(switches),
            src=np.asarray(src, dtype=np.int32),
            dst=np.asarray(dst, dtype=np.int32),
            ts=ts_a,
            nbytes=np.asarray(nbytes, dtype=np.int64),
            duration=np.asarray(duration, dtype=np.int64),
            sw_ptr=ptr,
            sw_idx=idx,
        )
        if n > 1 and bool(np.any(ts_a[1:] < ts_a[:-1])):
            table = table.take(np.argsort(ts_a, kind="stable"))
        return table

    def take(self, rows: IntArray | npt.NDArray[np.bool_]) -> FlowTable:
        """The flows at ``rows`` (indices or a mask), names kept; order as given."""
        rows = np.flatnonzero(rows) if rows.dtype == np.bool_ else rows.astype(np.int64)
        lo, hi = self.sw_ptr[rows], self.sw_ptr[rows + 1]
        counts = hi - lo
        ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        gather = np.repeat(lo - ptr[:-1], counts) + np.arange(int(ptr[-1]), dtype=np.int64)
        return FlowTable(
            endpoints=self.endpoints,
            switches=self.switches,
            src=self.src[rows],
            dst=self.dst[rows],
            ts=self.ts[rows],
            nbytes=self.nbytes[rows],
            duration=self.duration[rows],
            sw_ptr=ptr,
            sw_idx=self.sw_idx[gather],
        )

    def window(self, since_ns: int | None = None, until_ns: int | None = None) -> FlowTable:
        """Flows that start in ``[since_ns, until_ns)`` (None: open)."""
        lo = 0 if since_ns is None else int(np.searchsorted(self.ts, since_ns, side="left"))
        hi = len(self) if until_ns is None else int(np.searchsorted(self.ts, until_ns, "left"))
        return self.take(np.arange(lo, hi, dtype=np.int64))

    def iter_flows(self) -> Iterator[models.NetFlow]:
        """Every row as its ``flows.jsonl`` model, in start order (to write a window out)."""
        columns = (self.ts, self.src, self.dst, self.nbytes, self.duration)
        return tables.net_flow_models(
            self.endpoints, self.switches, columns, self.sw_ptr, self.sw_idx
        )

    def path_rows(self, rows: IntArray) -> tuple[IntArray, I32Array]:
        """(flow row, switch index) for every switch on the paths of ``rows``, exploded."""
        lo, hi = self.sw_ptr[rows], self.sw_ptr[rows + 1]
        counts = hi - lo
        flow = np.repeat(rows, counts)
        start = np.cumsum(counts) - counts
        gather = np.repeat(lo - start, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        return flow, self.sw_idx[gather]
