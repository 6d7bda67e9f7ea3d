"""Completed operations grouped into rounds: one round is one trace id (comm, seq) (CCL-D §5.1).

For every round the members' start/end/duration give what both papers compare:

- CCL-D §4.2.1-4.2.2: ``Tmax``/``Tmin`` = longest/shortest duration among the members of a round.
  A member that arrives last waits for nobody, so its duration is the pure transfer time; the
  first to arrive waits for the last one, so ``Tmax - Tmin`` is the arrival spread.
- Mycroft Algorithm 2 (AnalyzeStragglerRootCause): "iteration start and end times" per rank, to
  find constant late starts or ends.

Per operation row we also keep ``own``: the time the rank spent *outside* operations since its
previous completion on the same communicator (the previous round, where all members met), i.e.
that interval minus the durations of the operations it ran in between. A rank that computes
slowly has a long ``own``; a rank that arrives late only because it waited inside another
group's operation has an ordinary ``own`` and long durations elsewhere. That difference is what
separates a root cause from a victim across groups (Mycroft §5.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Rounds:
    """Rows sorted by (comm, seq, rank); ``rid`` maps a row to its round (``r_*`` arrays)."""

    rank: I64
    comm: I64
    seq: I64
    op: I64
    nbytes: I64
    start: I64
    end: I64
    own: I64  # ns outside operations since the rank's previous round of this comm (-1: unknown)
    rid: I64
    r_comm: I64
    r_seq: I64
    r_op: I64
    r_bytes: I64
    r_n: I64
    r_tmax: I64
    r_tmin: I64
    r_start_min: I64
    r_start_max: I64
    r_end_max: I64
    r_lo: I64  # first row of each round

    def __len__(self) -> int:
        return len(self.r_comm)

    @property
    def duration(self) -> I64:
        return self.end - self.start


def build(ops: tables.Table, history: tables.Table | None = None) -> Rounds:
    """Rounds of the given op rows (any subset of ``Bundle.ops``).

    ``history``: op rows before them (same table), used only for ``own``: a window's first
    round of a communicator then knows the rank's previous round of it, so a late start at the
    window's edge is judged like any other.
    """
    if len(ops) == 0:
        z = np.zeros(0, dtype=np.int64)
        return Rounds(*([z] * 20))
    if history is not None and len(history):
        own = _own(np.concatenate([history, ops]))[len(history) :]
    else:
        own = _own(ops)
    order = np.lexsort((ops["rank"], ops["seq"], ops["comm"]))
    o = ops[order]
    own = own[order]
    comm = o["comm"].astype(np.int64)
    seq = o["seq"].astype(np.int64)
    start = o["start"].astype(np.int64)
    end = o["end"].astype(np.int64)
    dur = end - start
    new = np.r_[True, (comm[1:] != comm[:-1]) | (seq[1:] != seq[:-1])]
    lo = np.flatnonzero(new)
    rid = np.cumsum(new) - 1
    counts = np.diff(np.r_[lo, len(o)])
    return Rounds(
        rank=o["rank"].astype(np.int64),
        comm=comm,
        seq=seq,
        op=o["op"].astype(np.int64),
        nbytes=o["bytes"].astype(np.int64),
        start=start,
        end=end,
        own=own,
        rid=rid,
        r_comm=comm[lo],
        r_seq=seq[lo],
        r_op=o["op"][lo].astype(np.int64),
        r_bytes=o["bytes"][lo].astype(np.int64),
        r_n=counts.astype(np.int64),
        r_tmax=np.maximum.reduceat(dur, lo),
        r_tmin=np.minimum.reduceat(dur, lo),
        r_start_min=np.minimum.reduceat(start, lo),
        r_start_max=np.maximum.reduceat(start, lo),
        r_end_max=np.maximum.reduceat(end, lo),
        r_lo=lo.astype(np.int64),
    )


def _own(ops: tables.Table) -> I64:
    """For each op row: time outside operations since the same rank's previous op on its comm."""
    n = len(ops)
    rank = ops["rank"].astype(np.int64)
    comm = ops["comm"].astype(np.int64)
    start = ops["start"].astype(np.int64)
    end = ops["end"].astype(np.int64)
    # Previous completion of the same (rank, comm), by seq.
    order = np.lexsort((ops["seq"], comm, rank))
    same = np.r_[
        False, (rank[order][1:] == rank[order][:-1]) & (comm[order][1:] == comm[order][:-1])
    ]
    prev_end = np.full(n, -1, dtype=np.int64)
    prev_end[order[same]] = end[order][np.flatnonzero(same) - 1]
    # Busy time: durations of the rank's ops starting inside [prev_end, start).
    t0 = int(start.min())
    span = int(max(start.max(), end.max())) - t0 + 2
    if int(rank.max()) + 1 > (1 << 62) // span:
        return np.full(n, -1, dtype=np.int64)  # keys would overflow; never at real scales
    key = rank * span + (start - t0)
    by_start = np.argsort(key, kind="stable")
    skey = key[by_start]
    cum = np.r_[0, np.cumsum((end - start)[by_start])]
    a = rank * span + (np.maximum(prev_end, t0) - t0)
    lo = np.searchsorted(skey, a, side="left")
    hi = np.searchsorted(skey, key, side="left")
    busy = cum[hi] - cum[lo]
    own = (start - prev_end) - busy
    return np.where(prev_end >= 0, np.maximum(own, 0), -1).astype(np.int64)
