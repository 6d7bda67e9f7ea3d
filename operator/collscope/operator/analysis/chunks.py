"""Chunk states of flows (Mycroft §5.3, Table 4) and the sender/receiver comparison.

A send flow counts ① GPU_ready, ② RDMA_transmitted (``sent``), ③ RDMA_done (``done``); a recv
flow counts posted, arrived (``done``) and consumed chunks (CCL-D §4.1.2 SendCount/RecvCount at
the same granularity). Table 4 reads one send flow:

============== ============== ============== ===================
state          condition      local cause    remote cause
============== ============== ============== ===================
not started    ①=②=③=0        uninitialized  blocked
not transmitted ① > ②         RDMA issue     receiver not ready
not delivered  ② > ③          RDMA issue     receiver failed
GPU not ready  ①=②=③ > 0      GPU issue      -
============== ============== ============== ===================

Mycroft §5.3 resolves local vs remote by comparing the sender with its receiver ("spatially,
comparing states between ranks"). We pair each send flow with the receiver's recv flow of the
same (comm, seq, channel) and decide:

- ``ready > sent`` while the receiver has free posted buffers (posted > done): the sender could
  send and did not, a local RDMA/NIC issue (*blocked at the network*);
- ``ready > sent`` while the receiver has no free buffer (posted == done): *receiver not ready*,
  the receiver's GPU is not consuming;
- ``sent > done``: transmitted but never acknowledged, the path between the two is broken
  (*blocked at the network*; both endpoints are suspects, the common endpoint of most such flows
  is the NIC at fault);
- ``ready == sent == done`` below ``total``: the sender's GPU produced nothing more (*GPU not
  ready*): either it waits for upstream data (its own recv flows still wait, posted > done) or
  its GPU stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from collscope.nodeagent.bundle import tables
from collscope.operator.analysis import view

I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class FlowTable:
    """Flows of some state records, each with its owner; one row per flow."""

    owner: I64  # global rank that wrote the state record
    comm: I64
    seq: I64
    ts: I64  # ns, the state record's time
    channel: I64
    peer: I64
    send: Bools  # True: send flow, False: recv flow
    total: I64
    ready: I64
    sent: I64
    posted: I64
    done: I64
    consumed: I64
    idle: I64  # ns
    mate: I64  # row of the matching flow at the other end (-1: not in the table)

    def __len__(self) -> int:
        return len(self.owner)

    @property
    def sender(self) -> I64:
        return np.where(self.send, self.owner, self.peer)

    @property
    def receiver(self) -> I64:
        return np.where(self.send, self.peer, self.owner)


def of_states(bundle: tables.Bundle, state_rows: npt.NDArray[np.intp]) -> FlowTable:
    """Flows of ``bundle.states[state_rows]``, paired with their mates among the same rows."""
    st = bundle.states[state_rows]
    lo = st["flow_lo"].astype(np.int64)
    hi = st["flow_hi"].astype(np.int64)
    take = view.gather_ranges(lo, hi)
    reps = hi - lo
    f = bundle.flows[take]

    def rep(col: str) -> I64:
        return np.repeat(st[col].astype(np.int64), reps)

    owner, comm, seq = rep("rank"), rep("comm"), rep("seq")
    send = f["dir"] == tables.SEND
    peer = f["peer"].astype(np.int64)
    channel = f["channel"].astype(np.int64)
    src = np.where(send, owner, peer)
    dst = np.where(send, peer, owner)
    ts = rep("ts")
    idle = f["idle_ns"].astype(np.int64)
    mate = _pair(np.stack([comm, seq, channel, src, dst], axis=1), send, ts, idle)
    return FlowTable(
        owner=owner,
        comm=comm,
        seq=seq,
        ts=ts,
        channel=channel,
        peer=peer,
        send=send,
        total=f["total"].astype(np.int64),
        ready=f["ready"].astype(np.int64),
        sent=f["sent"].astype(np.int64),
        posted=f["posted"].astype(np.int64),
        done=f["done"].astype(np.int64),
        consumed=f["consumed"].astype(np.int64),
        idle=idle,
        mate=mate,
    )


def _pair(keys: I64, send: Bools, ts: I64, idle: I64) -> I64:
    """Row of the other end of each flow (same comm, seq, channel, src, dst) that shows it at
    the same instant, the nearest in time such sample, or -1.

    A window holds many samples of one operation; a send must be judged against what its
    receiver looked like at that instant. A sample taken at or before it is the latest word;
    one taken *after* it describes the instant only if that flow had not changed since
    (``idle_ns`` >= the gap): a frozen flow looks the same at both times. Otherwise it shows a
    later state: a receiver that entered the operation after the sender's sample had posted no
    buffer then (in NCCL the sender's proxy waits for the receiver's credits, ProxyStep
    ``SendPeerWait``), whatever its later sample shows. Times are on one clock
    (``clocks.aligned``)."""
    mate = np.full(len(keys), -1, dtype=np.int64)
    if len(keys) == 0:
        return mate
    _, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1).astype(np.int64)
    # (group, time in ms) in one int64: groups < 2**31, times within 2**32 ms (49 days).
    ms = (ts - ts.min()) // 1_000_000
    comp = (inv << 32) | np.minimum(ms, (1 << 32) - 1)
    rows = np.arange(len(keys), dtype=np.int64)
    for mine, other in ((send, ~send), (~send, send)):
        o_rows = rows[other][np.argsort(comp[other], kind="stable")]
        if len(o_rows) == 0:
            continue
        o_comp = comp[o_rows]
        q = rows[mine]
        # Two candidates each side of the instant (the nearest may fall in the same
        # millisecond on the wrong side of it).
        pos = np.searchsorted(o_comp, comp[q], side="right")
        best = np.full(len(q), -1, dtype=np.int64)
        gap = np.full(len(q), np.iinfo(np.int64).max, dtype=np.int64)
        for cand in (pos - 2, pos - 1, pos, pos + 1):
            ok = (cand >= 0) & (cand < len(o_rows))
            c = np.clip(cand, 0, len(o_rows) - 1)
            r = o_rows[c]
            ok &= inv[r] == inv[q]
            later = ts[r] - ts[q]
            ok &= (later <= 0) | (idle[r] >= later)  # a later sample only if it was frozen
            d = np.abs(later)
            better = ok & (d < gap)
            best = np.where(better, r, best)
            gap = np.where(better, d, gap)
        mate[q] = best
    return mate


@dataclass(frozen=True)
class Verdicts:
    """Table 4 verdicts per flow row (only meaningful on the rows the name says)."""

    unfinished: Bools  # the flow has chunks left to move
    not_started: Bools  # send: ready = sent = done = 0
    not_transmitted: Bools  # send: ready > sent
    not_delivered: Bools  # send: sent > done
    gpu_not_ready: Bools  # send: ready = sent = done > 0, unfinished
    net_blocked: Bools  # send: not delivered, or not transmitted with the receiver ready
    receiver_not_ready: Bools  # send: not transmitted, receiver has no free buffer
    waiting: Bools  # recv: posted > done, unfinished (waiting for data)
    unconsumed: Bools  # recv: done > consumed (arrived, GPU has not consumed)


def verdicts(ft: FlowTable) -> Verdicts:
    s = ft.send
    unfinished = np.where(s, ft.done < ft.total, ft.consumed < ft.total)
    not_started = s & (ft.ready == 0) & (ft.sent == 0) & (ft.done == 0) & unfinished
    not_tx = s & (ft.ready > ft.sent)
    not_dl = s & (ft.sent > ft.done)
    gpu_nr = s & (ft.ready == ft.sent) & (ft.sent == ft.done) & (ft.done > 0) & unfinished
    has_mate = ft.mate >= 0
    m = np.clip(ft.mate, 0, None)
    mate_ready = has_mate & (ft.posted[m] > ft.done[m])
    mate_full = has_mate & (ft.posted[m] <= ft.done[m])
    waiting = ~s & (ft.posted > ft.done) & unfinished
    unconsumed = ~s & (ft.done > ft.consumed)
    return Verdicts(
        unfinished=unfinished,
        not_started=not_started,
        not_transmitted=not_tx,
        not_delivered=not_dl,
        gpu_not_ready=gpu_nr,
        net_blocked=not_dl | (not_tx & mate_ready),
        receiver_not_ready=not_tx & mate_full,
        waiting=waiting,
        unconsumed=unconsumed,
    )


def endpoint_counts(ranks: I64, rows: Bools, ft: FlowTable) -> I64:
    """How many of the selected flow rows have each of ``ranks`` as sender or receiver.

    Send and recv rows describe the same hop; only send rows are counted, so a hop counts once
    per endpoint whatever the coverage of recv flows.
    """
    sel = rows & ft.send
    ends = np.concatenate([ft.sender[sel], ft.receiver[sel]])
    if len(ends) == 0:
        return np.zeros(len(ranks), dtype=np.int64)
    uniq, cnt = np.unique(ends, return_counts=True)
    pos = np.clip(np.searchsorted(uniq, ranks), 0, len(uniq) - 1)
    return np.where(uniq[pos] == ranks, cnt[pos], 0).astype(np.int64)
