"""Which NIC stopped, from the flows it blocked (``hang.network``; Mycroft §5.3, Table 4).

NCCL moves every inter-node chunk through the NICs at both ends of its hop: the sender's proxy
posts an RDMA write on its NIC (``sent``), the receiver's NIC places it in a posted buffer and
the sender's NIC gets the acknowledgement (``done``). A NIC that dies stops every flow through
it, whatever the communicator and in both directions: its own sends stay ``sent > done``, and
so do the sends of every peer towards it, while each peer's other flows, through its own
healthy NIC, are not blocked at the network. So the dead NIC is the device that is an endpoint
of the most blocked flows (``chunks.Verdicts.net_blocked``):

- in a ring over three or more DP peers on as many nodes, it carries two blocked hops (in and
  out, on every channel) and each neighbour's NIC one;
- the rank's stuck flows on other communicators (a pipeline send or receive in flight at the
  same time) go through the same NIC and count for it, so the stuck operations of every
  communicator are read, not only the origin of the hang;
- a NIC shared by several ranks of a node (job.json ``ranks[].nic``: NCCL gives each GPU its
  nearest NIC, and nodes with fewer NICs than GPUs pair them) collects the blocked flows of all
  of them. Counting is by device (node, NIC); a rank whose NIC job.json does not name is taken
  to have one of its own.

Candidates are the two ends of the origin operation's blocked flows; flows elsewhere only add
to those. When several devices are endpoints of equally many blocked flows (every blocked flow
runs between the same two NICs: a pipeline send, a two-rank DP ring, a ring whose only
inter-node hop is this one) the flows cannot tell which end died. The verdict then lists them
with equal scores and margin 0 (confidence <= 0.5) and names what settles it: the link state
of each NIC. A candidate NIC whose last ``nic_link_up`` sample (``hwsamples``, joined through
job.json by device) says down is the one.

How much of the group was seen (members whose flows were in flight in a sample) bounds a
verdict read from flows alone: an unseen member's flows could point elsewhere. A down link on
an endpoint of this operation's blocked flows is not read from flows: it is the fault itself,
observed on the device, and explains every blocked flow through it, so it does not need the
unseen members (``Blame.observed_down``; the verdict's coverage is then 1).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import chunks, diagnosis, hwsamples, inflight, placement, view

Key = tuple[str, str]  # (node, NIC); ("", "rank N") when job.json does not name the NIC
# Culprits listed: the dead NIC's ranks, then the runners-up. A length of the report, not a
# threshold: no verdict depends on it (the first culprit and the margin are computed first).
MAX_CULPRITS = 4


@dataclass(frozen=True)
class Blame:
    culprits: list[diagnosis.Culprit]
    evidence: list[str]
    margin: float  # 0..1, (best - second) / best over device scores; 0 when tied
    # The first NIC is the only top-scored candidate whose own link sample reports it down:
    # an observation independent of the flows, which unseen members' flows cannot outweigh.
    observed_down: bool = False


def _key(where: placement.Placement, rank: int) -> Key:
    k = where.nic_of(rank)
    return ("", f"rank {rank}") if k is None else k


def related(
    bundle: tables.Bundle,
    now: inflight.InFlight,
    context: npt.NDArray[np.intp],
    ranks: set[int],
) -> npt.NDArray[np.intp]:
    """Rows of ``context`` (in ``now``) owned by one of ``ranks`` or with a flow to or from one:
    the flows that may pass through the candidate NICs, without pairing the whole job's."""
    if len(context) == 0 or not ranks:
        return np.zeros(0, dtype=np.intp)
    want = np.asarray(sorted(ranks), dtype=np.int64)
    st = bundle.states[now.state_row[context]]
    keep = np.isin(st["rank"], want)
    lo, hi = st["flow_lo"].astype(np.int64), st["flow_hi"].astype(np.int64)
    has = hi > lo
    if has.any():
        take = view.gather_ranges(lo[has], hi[has])
        hit = np.isin(bundle.flows["peer"][take], want).astype(np.int64)
        offsets = np.cumsum(hi[has] - lo[has]) - (hi[has] - lo[has])
        keep[np.flatnonzero(has)] |= np.add.reduceat(hit, offsets) > 0
    return context[keep]


def blame(
    bundle: tables.Bundle,
    ft: chunks.FlowTable,
    v: chunks.Verdicts,
    origin: npt.NDArray[np.bool_],
    where: placement.Placement,
    *,
    progress: dict[int, float],
    t_ns: int,
    comm_id: str,
) -> Blame:
    """The NIC behind the blocked flows of ``ft`` (``origin``: rows of the origin operation,
    which must hold at least one blocked flow; the other rows are stuck flows elsewhere).
    ``progress``: chunk progress of the origin operation's members; among NICs with equal
    scores, the one whose ranks moved the least comes first (Mycroft's MinData), which orders
    the list but is no evidence: their scores stay equal."""
    blocked = np.flatnonzero(v.net_blocked & ft.send)
    sender, receiver = ft.sender, ft.receiver
    ends = [(int(sender[i]), int(receiver[i])) for i in blocked]
    cand = {_key(where, r) for i, e in zip(blocked, ends, strict=True) if origin[i] for r in e}
    count: Counter[Key] = Counter()
    outgoing: Counter[Key] = Counter()
    own: Counter[int] = Counter()
    elsewhere: Counter[Key] = Counter()
    for i, (s, r) in zip(blocked, ends, strict=True):
        ks, kr = _key(where, s), _key(where, r)
        for k, rank in ((ks, s), (kr, r)) if ks != kr else ((ks, s),):
            if k in cand:
                count[k] += 1
                own[rank] += 1
                outgoing[k] += k == ks
                elsewhere[k] += not origin[i]
    users = {r for k in cand for r in _ranks_of(where, k)}
    down = {_key(where, r): s for r, s in hwsamples.nic_down(bundle, sorted(users)).items()}
    down = {k: s for k, s in down.items() if k in cand}
    top_count = max(count.values())
    score = {k: count[k] + (top_count if k in down else 0) for k in count}

    def least(k: Key) -> float:
        return min((progress.get(r, 1.0) for r in _ranks_of(where, k) if own[r]), default=1.0)

    order = sorted(count, key=lambda k: (-score[k], -count[k], least(k), min(_ranks_of(where, k))))
    best = order[0]
    second = score[order[1]] if len(order) > 1 else 0
    margin = (score[best] - second) / score[best]
    tied = [k for k in order if count[k] == top_count]
    ev = [
        _headline(
            where,
            best,
            count=count,
            outgoing=outgoing,
            elsewhere=elsewhere,
            own=own,
            blocked=len(blocked),
        )
    ]
    flow = _flow_of(ft, v.net_blocked, origin, _ranks_of(where, best))
    if flow is not None:
        ev.append(_sentence(ft, flow, where, t_ns))
    if len(tied) > 1:
        ev.append(_tie(where, tied, down, count[best]))
    elif best in down:
        ev.append(_down_text(down[best]))
    culprits: list[diagnosis.Culprit] = []
    for k in order:
        for r in sorted((r for r in _ranks_of(where, k) if own[r]), key=lambda r: (-own[r], r)):
            f = _flow_of(ft, v.net_blocked, origin, (r,))
            culprits.append(
                _culprit(
                    bundle, where, r, score=score[k] / score[best], comm_id=comm_id, ft=ft, flow=f
                )
            )
    observed = best in down and sum(score[k] == score[best] for k in down) == 1
    return Blame(culprits[:MAX_CULPRITS], ev, margin, observed)


def _ranks_of(where: placement.Placement, k: Key) -> tuple[int, ...]:
    if k[0] == "":
        return (int(k[1].removeprefix("rank ")),)
    return where.by_nic.get(k, ())


def _name(where: placement.Placement, k: Key) -> str:
    ranks = _ranks_of(where, k)
    if k[0] == "":
        return f"the NIC of {where.label(ranks[0])}"
    who = ", ".join(map(str, ranks[:4])) + (" ..." if len(ranks) > 4 else "")
    return f"{k[1]} on {k[0]} (NIC of rank{'s' if len(ranks) > 1 else ''} {who})"


def _headline(
    where: placement.Placement,
    k: Key,
    *,
    count: Counter[Key],
    outgoing: Counter[Key],
    elsewhere: Counter[Key],
    own: Counter[int],
    blocked: int,
) -> str:
    other = f", {elsewhere[k]} on other communicators" if elsewhere[k] else ""
    text = (
        f"{count[k]} of {blocked} blocked network flows have {_name(where, k)} as an endpoint "
        f"({outgoing[k]} sent from it, {count[k] - outgoing[k]} sent to it{other})"
    )
    sharing = [r for r in _ranks_of(where, k) if own[r]]
    if len(sharing) > 1:
        text += f"; the NIC carries ranks {', '.join(map(str, sharing))}, all of them blocked"
    return text


def _tie(
    where: placement.Placement, tied: list[Key], down: dict[Key, hwsamples.Sample], n: int
) -> str:
    names = " and ".join(_name(where, k) for k in tied[:4])
    text = (
        f"collective evidence cannot tell which NIC stopped: {names} are endpoints of "
        f"{n} blocked flows each, and no other stuck flow through either NIC sets one apart"
    )
    settled = [k for k in tied if k in down]
    if len(settled) == 1:
        return text + f"; {_down_text(down[settled[0]])}, which settles it"
    if settled:
        return (
            text
            + "; the node agent reports "
            + " and ".join(f"{down[k].device} on {down[k].node}" for k in settled)
            + " down"
        )
    probes = " and ".join(
        f"the link state of {k[1]} on {k[0]}" if k[0] else f"the link state of the NIC of {k[1]}"
        for k in tied[:4]
    )
    return text + (
        f"; what would settle it: {probes} (the node agent's nic_link_up, or "
        f"/sys/class/infiniband/<hca>/ports/<port>/state on the node)"
    )


def _down_text(s: hwsamples.Sample) -> str:
    return f"the node agent's last sample of {s.device} on {s.node} reports its link down"


def _flow_of(
    ft: chunks.FlowTable,
    rows: npt.NDArray[np.bool_],
    origin: npt.NDArray[np.bool_],
    ranks: tuple[int, ...],
) -> int | None:
    """Of ``ranks``' blocked send flows, the most backlogged (the origin operation's first),
    else one towards them."""
    mine = np.isin(ft.owner, np.asarray(ranks, dtype=np.int64))
    towards = np.isin(ft.peer, np.asarray(ranks, dtype=np.int64))
    for scope in (origin, np.ones(len(ft), dtype=bool)):
        for who in (mine, towards):
            cand = np.flatnonzero(rows & ft.send & who & scope)
            if len(cand):
                return int(cand[np.argmax((ft.ready - ft.done)[cand])])
    return None


def _sentence(ft: chunks.FlowTable, i: int, where: placement.Placement, t_ns: int) -> str:
    s, r = int(ft.sender[i]), int(ft.receiver[i])
    text = (
        f"{where.label(s)}: {ft.ready[i]} chunks ready, {ft.sent[i]} sent, {ft.done[i]} done "
        f"of {ft.total[i]} on channel {ft.channel[i]} to rank {r} for "
        f"{placement.seconds(int(ft.idle[i]) + t_ns - int(ft.ts[i]))}"
    )
    m = int(ft.mate[i])
    if m >= 0:
        text += f"; rank {r} posted {ft.posted[m]} receives, {ft.done[m]} arrived"
    return text + f": the path between rank {s} and rank {r} stopped delivering"


def _culprit(
    bundle: tables.Bundle,
    where: placement.Placement,
    rank: int,
    *,
    score: float,
    comm_id: str,
    ft: chunks.FlowTable,
    flow: int | None,
) -> diagnosis.Culprit:
    if flow is None:
        return where.culprit(rank, component="nic", score=score, comm=comm_id)
    peer = int(ft.receiver[flow]) if int(ft.sender[flow]) == rank else int(ft.sender[flow])
    return where.culprit(
        rank,
        component="nic",
        score=score,
        comm=bundle.comm_id(int(ft.comm[flow])),  # the flow's, maybe another communicator
        channel=int(ft.channel[flow]),
        peer=peer,
    )
