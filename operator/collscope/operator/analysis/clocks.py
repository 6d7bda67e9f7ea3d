"""One clock for the whole bundle: node clock offsets estimated from the records themselves.

Every record's time is ``CLOCK_REALTIME`` of the host that wrote it, and hosts disagree by up to
tens of milliseconds (docs/spec/bundle-v1.md; EROICA §3 puts NTP's error at ~10 ms). Analysis
compares ranks of different nodes at *the same instant* (a sender's flow sample against its
receiver's, which member entered a round last), so a 50 ms skew is half a sampling interval of
wrong evidence. No clock service is trusted: the offsets come from the data.

Mechanism. An operation that spans nodes completes on all its members at nearly the same
instant: in NCCL's ring the last step's chunk reaches every rank within one network step of the
others, a tree's result is broadcast down in a few hops, and a Send completes when its
receiver's last chunk landed (the Recv's end). The spread of one round's end times is one chunk
transfer (microseconds to a few milliseconds), far below the skew. So a node's offset is the
median, over the multi-node rounds it takes part in, of its members' mean end minus the round's
median end. The round median itself carries the other nodes' offsets, so the estimate is
refined on the corrected times a few times (each pass removes most of the remaining bias; a
Gauss-Seidel pass on the median problem). Offsets are relative to the median node.

Ranks without a known node (no ``ranks`` in job.json) share one clock: nothing is corrected.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import placement

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

# Passes of the refinement: each pass shrinks the bias left by other nodes' offsets in the
# round median by the share of the round on other nodes; four passes bring a 50 ms skew well
# under a millisecond on rings of 2 or more nodes.
_PASSES = 4
# Rounds with fewer nodes than this say nothing about offsets.
_MIN_NODES = 2


@dataclass(frozen=True)
class Offsets:
    """Estimated clock offset of each rank's node (ns, to subtract from its times)."""

    ranks: I64  # sorted global ranks
    offset_ns: I64  # same length as ranks
    rounds: int  # multi-node rounds the estimate used (0: nothing corrected)

    def of(self, rank: int) -> int:
        i = int(np.searchsorted(self.ranks, rank))
        if i < len(self.ranks) and int(self.ranks[i]) == rank:
            return int(self.offset_ns[i])
        return 0

    @property
    def largest_ns(self) -> int:
        return int(np.abs(self.offset_ns).max()) if len(self.offset_ns) else 0


def estimate(bundle: tables.Bundle, where: placement.Placement) -> Offsets:
    """Per-node offsets from the end times of multi-node rounds (see module docstring)."""
    ops = bundle.ops
    ranks = bundle.ranks.astype(np.int64)
    zero = Offsets(ranks, np.zeros(len(ranks), dtype=np.int64), 0)
    if len(ops) == 0 or len(ranks) == 0:
        return zero
    node_names = sorted({n for r in ranks.tolist() if (n := where.node(int(r))) is not None})
    if len(node_names) < _MIN_NODES:
        return zero
    index = {n: i for i, n in enumerate(node_names)}
    node_of_rank = np.asarray(
        [index.get(where.node(int(r)) or "", -1) for r in ranks.tolist()], dtype=np.int64
    )
    pos = np.searchsorted(ranks, ops["rank"].astype(np.int64))
    node = node_of_rank[pos]
    known = node >= 0
    # A Send and its Recv share (comm, seq) in NCCL's p2p numbering per peer pair only when
    # seen from both sides; collectives share (comm, seq) on every member. Rounds are keyed by
    # (comm, seq, op family): a Send's round is matched with the Recv of the same comm and seq.
    key = np.stack(
        [ops["comm"].astype(np.int64), ops["seq"].astype(np.int64)],
        axis=1,
    )[known]
    end = ops["end"].astype(np.int64)[known]
    node = node[known]
    if len(key) == 0:
        return zero
    _, rid = np.unique(key, axis=0, return_inverse=True)
    rid = rid.reshape(-1)
    # Keep rounds spanning at least two nodes.
    pair = np.unique(np.stack([rid, node], axis=1), axis=0)
    n_nodes = np.bincount(pair[:, 0], minlength=int(rid.max()) + 1)
    keep = n_nodes[rid] >= _MIN_NODES
    if not keep.any():
        return zero
    rid, node, end = rid[keep], node[keep], end[keep]
    t0 = int(end.min())
    endf = (end - t0).astype(np.float64)
    off = np.zeros(len(node_names))
    for _ in range(_PASSES):
        corr = endf - off[node]
        med = _group_median(rid, corr)
        dev = corr - med[rid]
        # One value per (round, node): the mean deviation of the node's members in the round.
        rn = rid * len(node_names) + node
        u, inv = np.unique(rn, return_inverse=True)
        inv = inv.reshape(-1)
        mean_dev = np.bincount(inv, weights=dev) / np.bincount(inv)
        step = _group_median(u % len(node_names), mean_dev, size=len(node_names))
        off = off + step
        off = off - float(np.median(off))
    per_rank = np.where(node_of_rank >= 0, np.rint(off[np.clip(node_of_rank, 0, None)]), 0.0)
    return Offsets(ranks, per_rank.astype(np.int64), int(n_nodes[n_nodes >= _MIN_NODES].size))


def _group_median(group: I64, values: F64, *, size: int | None = None) -> F64:
    """Median of ``values`` per group id (0..size-1); 0 for empty groups."""
    n = int(group.max()) + 1 if size is None else size
    out = np.zeros(n)
    if len(values) == 0:
        return out
    order = np.lexsort((values, group))
    g, v = group[order], values[order]
    bounds = np.flatnonzero(np.r_[True, g[1:] != g[:-1], True])
    lo, hi = bounds[:-1], bounds[1:]
    mid_lo = v[lo + (hi - lo - 1) // 2]
    mid_hi = v[lo + (hi - lo) // 2]
    out[g[lo]] = (mid_lo + mid_hi) / 2.0
    return out


def aligned(bundle: tables.Bundle, off: Offsets) -> tables.Bundle:
    """``bundle`` with every rank's times moved onto the common clock (a new Bundle).

    A uniform shift per rank keeps each table's (rank, time) order. Durations (``idle_ns``,
    ``end - start``) are unchanged; hardware samples and liveness rows are moved with the rank
    they carry (a heartbeat is written by the rank's own host).
    """
    if off.rounds == 0 or off.largest_ns == 0:
        return bundle

    def shift(table: tables.Table, cols: tuple[str, ...]) -> tables.Table:
        if len(table) == 0:
            return table
        out = table.copy()
        pos = np.clip(np.searchsorted(off.ranks, out["rank"].astype(np.int64)), 0, None)
        pos = np.minimum(pos, len(off.ranks) - 1)
        hit = off.ranks[pos] == out["rank"].astype(np.int64)
        d = np.where(hit, off.offset_ns[pos], 0)
        for c in cols:
            out[c] = np.where(out[c] >= 0, out[c] - d, out[c])  # -1: unknown, kept
        return out

    return dataclasses.replace(
        bundle,
        comms=shift(bundle.comms, ("ts",)),
        ops=shift(bundle.ops, ("ts", "start", "end")),
        states=shift(bundle.states, ("ts", "start")),
        hw=shift(bundle.hw, ("ts",)),
        liveness=shift(bundle.liveness, ("ts", "heartbeat")),
    )
