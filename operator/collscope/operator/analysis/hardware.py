"""Hardware verdict on a stuck operation every member entered (CCL-D H3; Mycroft §5.2-5.3).

Reads the last state of each member for that trace id and applies the chunk table (``chunks``):

1. Network: flows blocked at the network (not delivered, or not transmitted although the
   receiver had buffers posted) implicate both endpoints; the rank that is an endpoint of the
   most of them is the culprit (its NIC is the one thing those paths share). With one NIC down
   in a ring, its rank is the endpoint of its own sends and of its predecessor's sends: twice
   the count of any neighbour. ``hang.network``, component ``nic``.
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
from collscope.operator.analysis import chunks, diagnosis, hwsamples, inflight, placement

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
) -> Verdict:
    """Verdict from the in-flight rows ``rows`` of ``now`` (one per entered member)."""
    ft = chunks.of_states(bundle, now.state_row[rows])
    ranks = np.asarray(sorted(int(r) for r in now.rank[rows]), dtype=np.int64)
    if len(ft) == 0:
        return _kernel_only(bundle, now, rows, where, comm_id)
    with_flows = len(np.unique(ft.owner)) / max(len(members), 1)
    v = chunks.verdicts(ft)
    net = chunks.endpoint_counts(ranks, v.net_blocked, ft).astype(np.float64)
    progress = _progress(ft, ranks)
    if net.max() > 0:
        counts = net.copy()
        down = hwsamples.nic_down(bundle, [int(r) for r in ranks[net > 0]])
        if down:  # the port state settles what the paths alone cannot (two-rank paths)
            net += np.array([float(int(r) in down) for r in ranks]) * float(net.max())
        order = np.lexsort((ranks, progress, -net))
        top = int(ranks[order[0]])
        second = float(net[order[1]]) if len(order) > 1 else 0.0
        margin = (float(net[order[0]]) - second) / float(net[order[0]])
        blocked = int(v.net_blocked[ft.send].sum())
        flow = _flow_of(ft, v.net_blocked, top)
        ev = [
            f"{int(counts[order[0]])} of {blocked} blocked network flows of this operation have "
            f"{where.label(top)} as an endpoint"
        ]
        if top in down:
            ev.append(
                f"{down[top].device} of {where.label(top)} reports its link down in the node "
                f"agent's last hardware sample"
            )
        ev += [_sentence(ft, flow, where, t_ns, top)] if flow is not None else []
        culprits = [
            _culprit(
                where,
                int(ranks[i]),
                "nic",
                score=net[i] / net.max(),
                comm_id=comm_id,
                ft=ft,
                flow=_flow_of(ft, v.net_blocked, int(ranks[i])),
            )
            for i in order[:4]
            if net[i] > 0
        ]
        return Verdict(Cat.HANG_NETWORK, culprits, ev, margin, with_flows)
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
            _culprit(
                where,
                int(ranks[i]),
                "gpu",
                score=gpu[i] / gpu.max(),
                comm_id=comm_id,
                ft=ft,
                flow=None,
            )
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
        _culprit(
            where,
            int(ranks[i]),
            "gpu",
            score=1.0 - float(progress[i]),
            comm_id=comm_id,
            ft=ft,
            flow=None,
        )
        for i in order[:4]
    ]
    return Verdict(Cat.HANG_GPU, culprits, ev, min(gap, 0.5), with_flows * 0.5)


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


def _flow_of(ft: chunks.FlowTable, rows: npt.NDArray[np.bool_], rank: int) -> int | None:
    """The culprit's most backlogged selected send flow, else one towards it."""
    own = np.flatnonzero(rows & ft.send & (ft.owner == rank))
    if len(own) == 0:
        own = np.flatnonzero(rows & ft.send & (ft.peer == rank))
    if len(own) == 0:
        return None
    return int(own[np.argmax((ft.ready - ft.done)[own])])


def _sentence(
    ft: chunks.FlowTable, i: int, where: placement.Placement, t_ns: int, culprit: int
) -> str:
    s, r = int(ft.sender[i]), int(ft.receiver[i])
    text = (
        f"{where.label(s)}: {ft.ready[i]} chunks ready, {ft.sent[i]} sent, {ft.done[i]} done "
        f"of {ft.total[i]} on channel {ft.channel[i]} to rank {r} for "
        f"{placement.seconds(int(ft.idle[i]) + t_ns - int(ft.ts[i]))}"
    )
    m = int(ft.mate[i])
    if m >= 0:
        text += f"; rank {r} posted {ft.posted[m]} receives, {ft.done[m]} arrived"
    return text + f": the NIC path of rank {culprit} stopped delivering"


def _culprit(
    where: placement.Placement,
    rank: int,
    component: diagnosis.Component,
    *,
    score: float,
    comm_id: str,
    ft: chunks.FlowTable,
    flow: int | None,
) -> diagnosis.Culprit:
    if flow is None:
        return where.culprit(rank, component=component, score=score, comm=comm_id)
    peer = int(ft.receiver[flow]) if int(ft.sender[flow]) == rank else int(ft.sender[flow])
    return where.culprit(
        rank,
        component=component,
        score=score,
        comm=comm_id,
        channel=int(ft.channel[flow]),
        peer=peer,
    )


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
