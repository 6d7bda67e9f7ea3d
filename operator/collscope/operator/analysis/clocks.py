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
transfer (microseconds to a few milliseconds), far below the skew. This is the observation
Mycroft (a collective's members finish together, so one member's late start is the others'
wait) and CCL-D (cross-rank comparison of one collective's progress) build on; the solve below
is ours.

Solve. A round's node deviates from the round's median end (over its nodes' mean ends) by its
offset minus the median of the round's nodes' offsets, which is the same for every round of one
communicator (its members do not change): per (communicator, node), the median deviation over
the communicator's rounds is o[node] - c[communicator], with a standard error from the rounds'
spread (robust to rounds that did not end together). Node offsets o and one nuisance c per
communicator are solved jointly: weighted least squares (weights 1 / standard error^2, so a
communicator whose rounds end exactly together, a Send and its Recv, counts more than one whose
ends scatter) with a Huber loss by reweighting, by conjugate gradients on the graph Laplacian
of the node-communicator graph; each connected set of nodes is anchored at its median node.
Why jointly: nodes i and i + 4 of a TP8xPP2xDP4 job are tied by pipeline Send/Recv as often as
by the DP collectives of their stage, and the previous estimate (per node, the median of its
per-round deviations over all its rounds, refined a few passes) sat inside the pipeline
rounds' cluster of deviations, which cannot see the pair's shared offset: such pairs stayed
up to 32 ms off after correction (bench/README.md, "Node clocks from the data"). Cost: a few
sorts of the completions, then a solve over nodes + communicators.

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

# Edge precision and robust solve. An edge is one (communicator, node): its rounds' deviations
# scatter by _MAD_SIGMA x their median absolute deviation (a normal's sigma), taken as at least
# _FLOOR_NS (1 ms: a chunk transfer or two; no edge is trusted a thousand times more than
# another, which also keeps the solve well conditioned); its median's standard error is
# _MEDIAN_SE x sigma / sqrt(rounds). Huber's loss counts an edge further than _HUBER_K standard
# errors from the solution with a weight shrinking as 1 / residual (a communicator whose members
# do not finish together, e.g. one whose ends are staggered around the ring); _IRLS_PASSES
# reweightings; conjugate gradients stop at _CG_TOL relative to the right-hand side.
_MAD_SIGMA = 1.4826
_FLOOR_NS = 1_000_000.0
_MEDIAN_SE = 1.2533
_HUBER_K = 2.0
_IRLS_PASSES = 3
_CG_TOL = 1e-9
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
    ranks = bundle.ranks.astype(np.int64)
    zero = Offsets(ranks, np.zeros(len(ranks), dtype=np.int64), 0)
    if len(bundle.ops) == 0 or len(ranks) == 0:
        return zero
    node_names = sorted({n for r in ranks.tolist() if (n := where.node(int(r))) is not None})
    if len(node_names) < _MIN_NODES:
        return zero
    index = {n: i for i, n in enumerate(node_names)}
    node_of_rank = np.asarray(
        [index.get(where.node(int(r)) or "", -1) for r in ranks.tolist()], dtype=np.int64
    )
    found = _rounds(bundle, ranks, node_of_rank)
    if found is None:
        return zero
    rid, comm, node, end, n_rounds = found
    size = len(node_names)
    c_id, n_id, dev = _deviations(rid, comm, node, end, size)
    # One edge per (communicator, node): the median deviation, and its standard error from the
    # rounds' spread (MAD, floored at a chunk transfer) over the square root of their number.
    ek, einv = np.unique(c_id * size + n_id, return_inverse=True)
    einv = einv.reshape(-1)
    d = _group_median(einv, dev, size=len(ek))
    spread = np.maximum(
        _MAD_SIGMA * _group_median(einv, np.abs(dev - d[einv]), size=len(ek)), _FLOOR_NS
    )
    # One round has no spread: the floor. A trigger window of 2 s holds a round or two of each
    # DP communicator; they still count (leaving them out left nodes 25 ms off there).
    se = _MEDIAN_SE * spread / np.sqrt(np.bincount(einv))
    n_comms = int(c_id.max()) + 1
    # Vertices 0..size-1 are nodes, size + c communicator c's own clock (its rounds' median).
    off = _solve(size + n_comms, size + ek // size, ek % size, d, se, nodes=size)
    per_rank = np.where(node_of_rank >= 0, np.rint(off[np.clip(node_of_rank, 0, None)]), 0.0)
    return Offsets(ranks, per_rank.astype(np.int64), n_rounds)


def _rounds(
    bundle: tables.Bundle, ranks: I64, node_of_rank: I64
) -> tuple[I64, I64, I64, I64, int] | None:
    """(round id, communicator, node, end) of every completion in a round spanning two or more
    nodes, and the number of such rounds; None when there are none.

    Rounds are keyed by (comm, seq): a collective's members share them, and a Send shares them
    with its Recv (the simulator's and NCCL's per-peer p2p numbering, seen from both sides)."""
    ops = bundle.ops
    node = node_of_rank[np.searchsorted(ranks, ops["rank"].astype(np.int64))]
    end = ops["end"].astype(np.int64)
    known = (node >= 0) & (end > 0)
    if not known.any():
        return None
    comm = ops["comm"].astype(np.int64)[known]
    key = np.stack([comm, ops["seq"].astype(np.int64)[known]], axis=1)
    end, node = end[known], node[known]
    _, rid = np.unique(key, axis=0, return_inverse=True)
    rid = rid.reshape(-1)
    pair = np.unique(np.stack([rid, node], axis=1), axis=0)
    n_nodes = np.bincount(pair[:, 0], minlength=int(rid.max()) + 1)
    keep = n_nodes[rid] >= _MIN_NODES
    if not keep.any():
        return None
    rounds = int(np.count_nonzero(n_nodes >= _MIN_NODES))
    return rid[keep], comm[keep], node[keep], end[keep], rounds


def _deviations(rid: I64, comm: I64, node: I64, end: I64, n: int) -> tuple[I64, I64, F64]:
    """(communicator, node, deviation) per (round, node): the node's members' mean end minus
    the median over the round's nodes of theirs. The ends of a round are one instant, so the
    deviation is the node's offset minus the median of the round's nodes' offsets (the same for
    every round of a communicator: its members do not change), plus a chunk transfer of
    jitter."""
    t0 = int(end.min())
    u, inv = np.unique(rid * n + node, return_inverse=True)
    inv = inv.reshape(-1)
    mean = np.bincount(inv, weights=(end - t0).astype(np.float64)) / np.bincount(inv)
    r_u = u // n
    c_u = np.zeros(len(u), dtype=np.int64)
    c_u[inv] = comm
    _, c_u = np.unique(c_u, return_inverse=True)
    med = _group_median(r_u, mean)
    return c_u.reshape(-1), u % n, mean - med[r_u]


def _solve(n: int, a: I64, b: I64, d: F64, se: F64, *, nodes: int) -> F64:
    """Offsets ``o`` of the first ``nodes`` of ``n`` vertices minimising
    sum_e rho((o[b] - o[a] - d[e]) / se[e]), rho Huber's with scale ``_HUBER_K`` (iteratively
    reweighted least squares from weights 1 / se^2), each connected set anchored at its median
    node; nodes on no edge get 0."""
    off = np.zeros(n)
    w0 = 1.0 / se**2
    w = w0
    for _ in range(_IRLS_PASSES):
        off = _cg(n, a, b, d, w=w, x=off)
        t = np.abs(off[b] - off[a] - d) / se
        w = w0 * np.minimum(1.0, _HUBER_K / np.maximum(t, 1e-9))
    comp = _components(n, a, b)[:nodes]
    return off[:nodes] - _group_median(comp, off[:nodes], size=n)[comp]


def _cg(n: int, a: I64, b: I64, d: F64, *, w: F64, x: F64) -> F64:
    """Solve the weighted graph Laplacian system L x = B^T W d by Jacobi-preconditioned
    conjugate gradients from ``x`` (L is singular per connected set; the right-hand side sums to
    zero on each, so the iterates stay consistent and the median anchoring fixes the constant)."""

    def lap(v: F64) -> F64:
        f = w * (v[b] - v[a])
        out = np.bincount(b, weights=f, minlength=n) - np.bincount(a, weights=f, minlength=n)
        return out.astype(np.float64)

    rhs = np.bincount(b, weights=w * d, minlength=n) - np.bincount(a, weights=w * d, minlength=n)
    deg = np.bincount(a, weights=w, minlength=n) + np.bincount(b, weights=w, minlength=n)
    inv_deg = np.where(deg > 0, 1.0 / np.where(deg > 0, deg, 1.0), 0.0)
    x = x.copy()
    r = rhs - lap(x)
    z = r * inv_deg
    p = z.copy()
    rz = float(r @ z)
    tol = _CG_TOL * max(float(np.sqrt(rhs @ (rhs * inv_deg))), 1.0)
    for _ in range(4 * n + 50):
        if np.sqrt(max(rz, 0.0)) <= tol:
            break
        lp = lap(p)
        alpha = rz / float(p @ lp)
        x += alpha * p
        r -= alpha * lp
        z = r * inv_deg
        rz_new = float(r @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x


def _components(n: int, a: I64, b: I64) -> I64:
    """Connected set of each node (the smallest node id in it) by label propagation."""
    label = np.arange(n, dtype=np.int64)
    while True:
        low = np.minimum(label[a], label[b])
        new = label.copy()
        np.minimum.at(new, a, low)
        np.minimum.at(new, b, low)
        new = new[new]
        if np.array_equal(new, label):
            return label
        label = new


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
