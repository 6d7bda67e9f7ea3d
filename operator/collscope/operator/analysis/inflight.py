"""What each rank is doing at a time t: its operations in flight and since when they are stalled.

Mycroft §4.2 gives two logs: the completion log (our ``op`` records) and the real-time state log
written every ~100 ms while an operation is in progress (our ``state`` records). An operation of
rank r on communicator c is *in flight* at t when r's latest state record for c at or before t

- names a sequence number r has not completed by t (no ``op`` record with ts <= t for it), and
- is recent (at most ``max_age`` state intervals old), or r wrote nothing at all after it:
  a frozen or crashed process leaves its last state as the last word (Mycroft §4.2: the state
  log runs "until the CollOp completes or the NCCL proxy thread exits or crashes").

*Stall start* (ns) is when the operation last made progress, as far as the records tell:

- with flows: ``ts - min(idle_ns)`` over its flows (a flow's ``idle_ns`` is the time since any
  of its counts changed, so the minimum is the time since anything moved);
- without flows but with kernel progress: the first state of the trailing run of states whose
  ``kernel.done`` did not change (the op start when it never changed from zero);
- with neither: the op start (nothing tells progress; the whole op counts as a stall).

All functions are vectorised over ranks: a 16k-rank window is a few numpy passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import view

I64 = npt.NDArray[np.int64]
_NONE = np.int64(-1)


@dataclass(frozen=True)
class InFlight:
    """Operations in flight at ``t_ns``, one row per (rank, comm); arrays of equal length."""

    t_ns: int
    rank: I64
    comm: I64
    seq: I64
    op: I64  # index into Bundle.strings
    nbytes: I64
    start: I64  # ns, when the rank entered the operation
    ts: I64  # ns, its latest state record
    state_row: npt.NDArray[np.intp]  # that record's row in Bundle.states
    stall_start: I64  # ns, last progress (see module docstring)
    has_flows: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.rank)

    @property
    def stalled_ns(self) -> I64:
        return np.int64(self.t_ns) - self.stall_start


@dataclass(frozen=True)
class Completed:
    """Highest completed sequence number per (rank, comm), from op records with ts <= t."""

    keys: I64  # rank * ncomm + comm, sorted
    seq: I64
    last_end: I64  # ns, end of that rank's latest completion on that comm
    ncomm: int

    def lookup(self, rank: I64, comm: I64) -> I64:
        """Completed seq for each (rank, comm) pair; -1 where none was seen."""
        key = np.asarray(rank, dtype=np.int64) * self.ncomm + np.asarray(comm, dtype=np.int64)
        if len(self.keys) == 0:
            return np.full(len(key), _NONE, dtype=np.int64)
        pos = np.clip(np.searchsorted(self.keys, key), 0, len(self.keys) - 1)
        return np.where(self.keys[pos] == key, self.seq[pos], _NONE)


def completed(bundle: tables.Bundle, t_ns: int) -> Completed:
    ops = bundle.ops[bundle.ops["ts"] <= t_ns]
    ncomm = max(len(bundle.comm_ids), 1)
    if len(ops) == 0:
        z = np.zeros(0, dtype=np.int64)
        return Completed(keys=z, seq=z, last_end=z, ncomm=ncomm)
    key = ops["rank"].astype(np.int64) * ncomm + ops["comm"]
    order = np.lexsort((ops["seq"], key))
    key, seq, end = key[order], ops["seq"][order].astype(np.int64), ops["end"][order]
    last = np.flatnonzero(np.r_[key[1:] != key[:-1], True])
    last_end = np.maximum.reduceat(end, np.r_[0, last[:-1] + 1])
    return Completed(keys=key[last], seq=seq[last], last_end=last_end.astype(np.int64), ncomm=ncomm)


def infer_interval_ns(bundle: tables.Bundle, default_ns: int) -> int:
    """The agent's state sampling period: median gap between states of the same operation."""
    st = bundle.states
    if len(st) < 3:
        return default_ns
    order = np.lexsort((st["ts"], st["seq"], st["comm"], st["rank"]))
    s = st[order]
    same = (
        (s["rank"][1:] == s["rank"][:-1])
        & (s["comm"][1:] == s["comm"][:-1])
        & (s["seq"][1:] == s["seq"][:-1])
    )
    gaps = (s["ts"][1:] - s["ts"][:-1])[same]
    gaps = gaps[gaps > 0]
    return int(np.median(gaps)) if len(gaps) >= 3 else default_ns


def at(
    bundle: tables.Bundle, t_ns: int, *, interval_ns: int, max_age_intervals: float = 2.0
) -> InFlight:
    """Operations in flight at ``t_ns`` on every rank of ``bundle`` (see module docstring)."""
    sel = np.flatnonzero(bundle.states["ts"] <= t_ns)
    st = bundle.states[sel]
    ncomm = max(len(bundle.comm_ids), 1)
    empty = np.zeros(0, dtype=np.int64)
    if len(st) == 0:
        return InFlight(
            t_ns,
            empty,
            empty,
            empty,
            empty,
            empty,
            empty,
            empty,
            np.zeros(0, dtype=np.intp),
            empty,
            np.zeros(0, dtype=bool),
        )
    order = np.lexsort((st["ts"], st["seq"], st["comm"], st["rank"]))
    st, sel = st[order], sel[order]
    key = st["rank"].astype(np.int64) * ncomm + st["comm"]
    n = len(st)
    # Trailing run of unchanged kernel progress inside each (rank, comm, seq).
    new_op = np.r_[True, (key[1:] != key[:-1]) | (st["seq"][1:] != st["seq"][:-1])]
    change = new_op | np.r_[True, st["kernel_done"][1:] != st["kernel_done"][:-1]]
    idx = np.arange(n)
    run_start = np.maximum.accumulate(np.where(change, idx, 0))
    op_start_idx = np.maximum.accumulate(np.where(new_op, idx, 0))
    last = np.flatnonzero(np.r_[key[1:] != key[:-1], True])  # latest state per (rank, comm)
    s = st[last]
    done = completed(bundle, t_ns).lookup(s["rank"].astype(np.int64), s["comm"].astype(np.int64))
    # Latest record of any kind per rank, to tell a silent rank from one that moved on.
    last_any = _last_record_ts(bundle, t_ns)
    ranks_sorted, ts_sorted = last_any
    pos = np.clip(np.searchsorted(ranks_sorted, s["rank"]), 0, max(len(ranks_sorted) - 1, 0))
    rank_last = ts_sorted[pos] if len(ranks_sorted) else s["ts"]
    fresh = (np.int64(t_ns) - s["ts"]) <= np.int64(max_age_intervals * interval_ns)
    silent = rank_last <= s["ts"]
    keep = (s["seq"] > done) & (fresh | silent)
    s, last = s[keep], last[keep]
    lo, hi = s["flow_lo"], s["flow_hi"]
    has_flows = hi > lo
    min_idle = np.zeros(len(s), dtype=np.int64)
    if has_flows.any():
        nz = np.flatnonzero(has_flows)
        min_idle[nz] = segment_min(bundle.flows["idle_ns"], lo[nz], hi[nz])
    start = s["start"].astype(np.int64)
    flow_stall = np.maximum(start, s["ts"] - min_idle)
    rs = run_start[last]
    kernel_stall = np.where(
        (rs == op_start_idx[last]) & (s["kernel_done"] <= 0), start, st["ts"][rs]
    )
    kernel_stall = np.maximum(start, kernel_stall)
    has_kernel = s["kernel_channels"] >= 0
    stall = np.where(has_flows, flow_stall, np.where(has_kernel, kernel_stall, start))
    return InFlight(
        t_ns=t_ns,
        rank=s["rank"].astype(np.int64),
        comm=s["comm"].astype(np.int64),
        seq=s["seq"].astype(np.int64),
        op=s["op"].astype(np.int64),
        nbytes=s["bytes"].astype(np.int64),
        start=start,
        ts=s["ts"].astype(np.int64),
        state_row=sel[last],
        stall_start=stall.astype(np.int64),
        has_flows=has_flows,
    )


def segment_min(values: I64, lo: I64, hi: I64) -> I64:
    """``[values[a:b].min() for a, b in zip(lo, hi)]`` for non-empty slices, vectorised."""
    take = view.gather_ranges(lo, hi)
    lengths = hi - lo
    offsets = np.cumsum(lengths) - lengths
    return np.minimum.reduceat(values[take], offsets).astype(np.int64)


def _last_record_ts(bundle: tables.Bundle, t_ns: int) -> tuple[I64, I64]:
    """(ranks sorted, latest op/state ts <= t of each)."""
    parts_r, parts_t = [], []
    for table in (bundle.ops, bundle.states):
        m = table["ts"] <= t_ns
        parts_r.append(table["rank"][m].astype(np.int64))
        parts_t.append(table["ts"][m].astype(np.int64))
    r = np.concatenate(parts_r)
    t = np.concatenate(parts_t)
    if len(r) == 0:
        return r, t
    order = np.lexsort((t, r))
    r, t = r[order], t[order]
    last = np.flatnonzero(np.r_[r[1:] != r[:-1], True])
    return r[last], t[last]
