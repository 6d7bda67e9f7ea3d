"""Hardware verdict on a stuck operation every member entered (CCL-D H3; Mycroft §5.2-5.3).

Reads the last state of each member for that trace id and applies the chunk table (``chunks``):

1. Network: flows blocked at the network (not delivered, or not transmitted although the
   receiver had buffers posted) implicate both endpoints' NICs; ``nics`` names the NIC that is
   an endpoint of the most of them, counting the stuck flows of other communicators through
   the same NICs too, and says when the flows cannot tell two NICs apart. ``hang.network``,
   component ``nic``.
2. GPU: a rank that delivered everything it produced (ready = sent = done on every send flow)
   while data for it arrived and sits unconsumed (done > consumed) or its senders find no free
   buffer (receiver not ready) has a GPU that stopped. ``hang.gpu``, component ``gpu``.
3. Otherwise MinData (Mycroft Algorithm 2 line 8, CCL-D "fewest SendCount/RecvCount"): the
   member with the least chunk progress, reported as ``hang.gpu`` with a small margin.

Without flows (an operation entirely inside one node: NVLink has no proxy) only kernel progress
is known: every rank on the node is a culprit, least kernel progress first, precision ``node``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import chunks, diagnosis, inflight, nics, placement

Cat = diagnosis.Category


@dataclass(frozen=True)
class Verdict:
    category: diagnosis.Category
    culprits: list[diagnosis.Culprit]
    evidence: list[str]
    margin: float
    coverage: float
    precision: Literal["rank", "node"] = "rank"


def judge(
    bundle: tables.Bundle,
    now: inflight.InFlight,
    rows: npt.NDArray[np.intp],
    where: placement.Placement,
    *,
    t_ns: int,
    members: tuple[int, ...],
    comm_id: str,
    context: npt.NDArray[np.intp] | None = None,
) -> Verdict:
    """Verdict from the in-flight rows ``rows`` of ``now`` (one per entered member);
    ``context``: rows of ``now`` stuck in other operations, whose flows through the same NICs
    are evidence of a network fault too."""
    ft = chunks.of_states(bundle, now.state_row[rows])
    ranks = np.asarray(sorted(int(r) for r in now.rank[rows]), dtype=np.int64)
    if len(ft) == 0:
        return _kernel_only(bundle, now, rows, where, comm_id)
    with_flows = len(np.unique(ft.owner)) / max(len(members), 1)
    v = chunks.verdicts(ft)
    progress = _progress(ft, ranks)
    if (v.net_blocked & ft.send).any():
        moved = dict(zip(ranks.tolist(), progress.tolist(), strict=True))
        b = _network(
            bundle,
            now,
            rows,
            context=context,
            where=where,
            ft=ft,
            v=v,
            progress=moved,
            t_ns=t_ns,
            comm_id=comm_id,
        )
        seen = 1.0 if b.observed_down else with_flows  # nics.py: a down link needs no more
        return Verdict(Cat.HANG_NETWORK, b.culprits, b.evidence, b.margin, seen)
    gpu = _gpu_scores(ft, v, ranks)
    if gpu.max() > 0:
        order = np.lexsort((ranks, progress, -gpu))
        top = int(ranks[order[0]])
        second = float(gpu[order[1]]) if len(order) > 1 else 0.0
        margin = (float(gpu[order[0]]) - second) / float(gpu[order[0]])
        mine = ft.owner == top
        ready = int(ft.ready[mine & ft.send].sum())
        unc = int((ft.done - ft.consumed)[mine & ~ft.send].sum())
        rnr = int((v.receiver_not_ready & (ft.receiver == top)).sum())
        total = int(ft.total[mine & ft.send].sum())
        if unc == 0 and rnr == 0:
            ev = [
                f"{where.label(top)} only sends in this operation and delivered every chunk its "
                f"GPU produced ({ready} ready = sent = done of {total}) while its receivers "
                f"have buffers posted and wait: its GPU stopped producing"
            ]
        else:
            ev = [
                f"{where.label(top)} delivered every chunk its GPU produced ({ready} ready = "
                f"sent = done) while {unc} chunks arrived for it unconsumed and {rnr} sender "
                f"flows find it not ready to receive: its GPU stopped"
            ]
        culprits = [
            where.culprit(int(ranks[i]), component="gpu", score=gpu[i] / gpu.max(), comm=comm_id)
            for i in order[:4]
            if gpu[i] > 0
        ]
        return Verdict(Cat.HANG_GPU, culprits, ev, margin, with_flows)
    order = np.lexsort((ranks, progress))
    top = int(ranks[order[0]])
    gap = float(progress[order[1]] - progress[order[0]]) if len(order) > 1 else 0.0
    ev = [
        f"no flow is blocked at the network and no GPU stands out; {where.label(top)} made the "
        f"least chunk progress ({progress[order[0]]:.0%}): MinData"
    ]
    culprits = [
        where.culprit(int(ranks[i]), component="gpu", score=1.0 - float(progress[i]), comm=comm_id)
        for i in order[:4]
    ]
    # MinData (CCL-D's fewest Send/RecvCount) ranks, it does not observe: margin and coverage
    # capped at 0.5 keep its confidence <= 0.5 (issue 12 item 2). A calibration cap, picked.
    return Verdict(Cat.HANG_GPU, culprits, ev, min(gap, 0.5), with_flows * 0.5)


def _network(
    bundle: tables.Bundle,
    now: inflight.InFlight,
    rows: npt.NDArray[np.intp],
    *,
    context: npt.NDArray[np.intp] | None,
    where: placement.Placement,
    ft: chunks.FlowTable,
    v: chunks.Verdicts,
    progress: dict[int, float],
    t_ns: int,
    comm_id: str,
) -> nics.Blame:
    """``nics.blame`` over this operation's flows and the stuck flows elsewhere that touch a
    rank of a candidate NIC (an end of one of this operation's blocked flows)."""
    blocked = v.net_blocked & ft.send
    ends = np.concatenate([ft.sender[blocked], ft.receiver[blocked]]).tolist()
    cand = {u for r in ends for u in where.nic_users(int(r))}
    extra = np.zeros(0, dtype=np.intp)
    if context is not None:
        extra = nics.related(bundle, now, np.setdiff1d(context, rows), cand)
    if len(extra) == 0:
        origin = np.ones(len(ft), dtype=bool)
        return nics.blame(
            bundle, ft, v, origin, where, progress=progress, t_ns=t_ns, comm_id=comm_id
        )
    both = chunks.of_states(bundle, now.state_row[np.concatenate([rows, extra])])
    origin = np.arange(len(both)) < len(ft)  # of_states keeps the order of its state rows
    return nics.blame(
        bundle,
        both,
        chunks.verdicts(both),
        origin,
        where,
        progress=progress,
        t_ns=t_ns,
        comm_id=comm_id,
    )


def _progress(ft: chunks.FlowTable, ranks: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Chunk progress (done / total over a rank's flows, sends and receives)."""
    moved = np.where(ft.send, ft.done, ft.consumed).astype(np.float64)
    total = ft.total.astype(np.float64)
    pos = np.searchsorted(ranks, ft.owner)
    ok = (pos < len(ranks)) & (ranks[np.clip(pos, 0, len(ranks) - 1)] == ft.owner)
    num = np.bincount(pos[ok], weights=moved[ok], minlength=len(ranks))
    den = np.bincount(pos[ok], weights=total[ok], minlength=len(ranks))
    return np.where(den > 0, num / np.maximum(den, 1.0), 1.0)


def _gpu_scores(
    ft: chunks.FlowTable, v: chunks.Verdicts, ranks: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    out = np.zeros(len(ranks), dtype=np.float64)
    for i, r in enumerate(ranks.tolist()):
        mine_send = (ft.owner == r) & ft.send
        if (ft.ready[mine_send] != ft.done[mine_send]).any():
            continue  # it has produced chunks still on their way: not a stopped GPU
        unconsumed = int((v.unconsumed & (ft.owner == r)).sum())
        rnr = int((v.receiver_not_ready & (ft.receiver == r)).sum())
        out[i] = unconsumed + rnr + _starved(ft, r)
    return out


def _starved(ft: chunks.FlowTable, r: int) -> int:
    """Send flows of a pure sender (no receive in this operation: its data needs nothing from
    the network) that stopped short, everything produced delivered, while the receiver has
    buffers posted and waiting: the sending GPU stopped producing (a p2p ``Send``)."""
    mine = ft.owner == r
    if not (mine & ft.send).any() or (mine & ~ft.send).any():
        return 0
    m = ft.mate
    waiting = np.zeros(len(ft), dtype=bool)
    has = m >= 0
    waiting[has] = ft.posted[m[has]] > ft.done[m[has]]
    stopped = mine & ft.send & (ft.ready < ft.total) & waiting
    return int(stopped.sum())


def _kernel_only(
    bundle: tables.Bundle,
    now: inflight.InFlight,
    rows: npt.NDArray[np.intp],
    where: placement.Placement,
    comm_id: str,
) -> Verdict:
    st = bundle.states[now.state_row[rows]]
    kc = st["kernel_channels"].astype(np.float64)
    frac = np.where(kc > 0, st["kernel_done"] / np.maximum(kc, 1.0), 0.0)
    ranks = now.rank[rows]
    order = np.lexsort((ranks, now.stall_start[rows], frac))
    nodes = {where.node(int(r)) for r in ranks}
    node = next(iter(nodes)) if len(nodes) == 1 else None
    ordered = [int(ranks[i]) for i in order]
    if node is not None:
        ordered += [r for r in where.ranks_on(node) if r not in ordered]
    culprits = [
        where.culprit(r, component="gpu", score=1.0 - 0.5 * k / max(len(ordered), 1), comm=comm_id)
        for k, r in enumerate(ordered)
    ]
    top = ordered[0]
    place = f"node {node}" if node else "the members' nodes"
    ev = [
        f"the stuck operation has no network flows (intra-node transport only); kernel "
        f"progress is the only signal: {where.label(top)} finished {frac[order[0]]:.0%} of "
        f"its channels. The fault lies on {place}; only node precision is possible"
    ]
    return Verdict(Cat.HANG_GPU, culprits, ev, 0.0, 1.0, precision="node")
