"""Flow tables, sender/receiver pairing and the Mycroft Table 4 verdicts."""

from __future__ import annotations

import numpy as np

from collscope.nodeagent.bundle import models, tables
from collscope.operator.analysis import chunks

S = 1_000_000_000
T = 8  # chunks per flow


def _send(ch: int, peer: int, ready: int, sent: int, done: int) -> tables.FlowTuple:
    return (ch, peer, tables.SEND, T, ready, sent, -1, done, -1, 0)


def _recv(ch: int, peer: int, posted: int, done: int, consumed: int) -> tables.FlowTuple:
    return (ch, peer, tables.RECV, T, -1, -1, posted, done, consumed, 0)


# (rank, seq) -> flows of its state record.
FLOWS: dict[tuple[int, int], list[tables.FlowTuple]] = {
    (0, 1): [
        _send(0, 1, 5, 3, 3),  # A: not transmitted, receiver has buffers -> network
        _send(1, 1, 4, 4, 4),  # B: GPU not ready
        _send(2, 2, 0, 0, 0),  # C: not started
        _send(3, 2, T, T, T),  # D: finished
    ],
    (1, 1): [
        _recv(0, 0, 6, 3, 3),  # mate of A: free buffers, waiting
        _send(0, 2, 5, 3, 3),  # E: not transmitted, receiver full -> receiver not ready
    ],
    (2, 1): [
        _recv(0, 1, 3, 3, 1),  # mate of E: full, two chunks unconsumed
        _send(0, 0, 6, 6, 2),  # F: sent, never acknowledged; rank 0 wrote no recv for it
    ],
    (1, 2): [_recv(0, 0, 6, 3, 3)],  # same hop as A's mate, but the next operation
}


def _table() -> tuple[tables.Bundle, chunks.FlowTable]:
    b = tables.BundleBuilder(models.Job(world_size=3))
    for (rank, seq), flows in FLOWS.items():
        b.add_state(
            rank=rank,
            ts=S + seq,
            comm="0xa",
            seq=seq,
            op="AllReduce",
            nbytes=T,
            start=S,
            flows=flows,
        )
    bundle = b.build()
    return bundle, chunks.of_states(bundle, np.arange(len(bundle.states)))


def _row(ft: chunks.FlowTable, owner: int, seq: int, channel: int, *, send: bool, peer: int) -> int:
    m = (
        (ft.owner == owner)
        & (ft.seq == seq)
        & (ft.channel == channel)
        & (ft.send == send)
        & (ft.peer == peer)
    )
    return int(np.flatnonzero(m).item())


def test_flow_table_has_one_row_per_flow_with_its_owner() -> None:
    bundle, ft = _table()
    assert len(ft) == sum(len(f) for f in FLOWS.values()) == len(bundle.flows)
    a = _row(ft, 0, 1, 0, send=True, peer=1)
    assert (ft.ready[a], ft.sent[a], ft.done[a], ft.total[a]) == (5, 3, 3, T)
    assert ft.sender[a] == 0 and ft.receiver[a] == 1
    r = _row(ft, 1, 1, 0, send=False, peer=0)
    assert (ft.posted[r], ft.done[r], ft.consumed[r]) == (6, 3, 3)
    assert ft.sender[r] == 0 and ft.receiver[r] == 1
    assert set(ft.ts.tolist()) == {S + 1, S + 2}


def test_sends_pair_with_the_receivers_flow_of_the_same_operation() -> None:
    _, ft = _table()
    a, a_mate = _row(ft, 0, 1, 0, send=True, peer=1), _row(ft, 1, 1, 0, send=False, peer=0)
    e, e_mate = _row(ft, 1, 1, 0, send=True, peer=2), _row(ft, 2, 1, 0, send=False, peer=1)
    assert ft.mate[a] == a_mate and ft.mate[a_mate] == a
    assert ft.mate[e] == e_mate and ft.mate[e_mate] == e
    assert ft.mate[_row(ft, 2, 1, 0, send=True, peer=0)] == -1  # F: no recv record
    assert ft.mate[_row(ft, 1, 2, 0, send=False, peer=0)] == -1  # seq 2 never pairs with seq 1


def test_subset_of_states_pairs_only_within_it() -> None:
    bundle, _ = _table()
    rows = np.flatnonzero(bundle.states["rank"] == 0)
    ft = chunks.of_states(bundle, rows)
    assert set(ft.owner.tolist()) == {0} and (ft.mate == -1).all()
    assert len(chunks.of_states(bundle, np.zeros(0, dtype=np.intp))) == 0


def test_table4_verdicts() -> None:
    _, ft = _table()
    v = chunks.verdicts(ft)
    a, b, c, d = (
        _row(ft, 0, 1, ch, send=True, peer=p) for ch, p in ((0, 1), (1, 1), (2, 2), (3, 2))
    )
    e, f = _row(ft, 1, 1, 0, send=True, peer=2), _row(ft, 2, 1, 0, send=True, peer=0)
    a_mate, e_mate = _row(ft, 1, 1, 0, send=False, peer=0), _row(ft, 2, 1, 0, send=False, peer=1)

    assert set(np.flatnonzero(v.not_transmitted).tolist()) == {a, e}
    assert set(np.flatnonzero(v.not_delivered).tolist()) == {f}
    assert set(np.flatnonzero(v.gpu_not_ready).tolist()) == {b}
    assert set(np.flatnonzero(v.not_started).tolist()) == {c}
    assert set(np.flatnonzero(v.net_blocked).tolist()) == {a, f}
    assert set(np.flatnonzero(v.receiver_not_ready).tolist()) == {e}
    assert set(np.flatnonzero(v.unconsumed).tolist()) == {e_mate}
    assert v.waiting[a_mate] and not v.waiting[e_mate]
    assert not v.unfinished[d] and v.unfinished[a]


def test_endpoint_counts_count_each_blocked_hop_once_per_end() -> None:
    _, ft = _table()
    v = chunks.verdicts(ft)
    ranks = np.asarray([0, 1, 2, 7], dtype=np.int64)
    # blocked hops: 0 -> 1 (A, also seen from its recv mate) and 2 -> 0 (F)
    assert chunks.endpoint_counts(ranks, v.net_blocked, ft).tolist() == [2, 1, 1, 0]
    none = np.zeros(len(ft), dtype=bool)
    assert chunks.endpoint_counts(ranks, none, ft).tolist() == [0, 0, 0, 0]


def _two_samples() -> tables.Bundle:
    """One hop 1 -> 2 sampled twice: at 2 s the sender's proxy sits on ready chunks while the
    receiver has buffers posted; 100 ms later everything has arrived."""
    b = tables.BundleBuilder(models.Job(world_size=3))
    samples = [
        (2 * S, _send(0, 2, 6, 2, 2), _recv(0, 1, 8, 2, 2)),
        (2 * S + 100_000_000, _send(0, 2, T, T, T), _recv(0, 1, T, T, T - 2)),
    ]
    for ts, snd, rcv in samples:
        for rank, flow in ((1, snd), (2, rcv)):
            b.add_state(
                rank=rank, ts=ts, comm="0xa", seq=2, op="AllReduce", nbytes=T, start=S, flows=[flow]
            )
    return b.build()


def test_each_sample_pairs_with_the_receivers_sample_of_its_time() -> None:
    bundle = _two_samples()
    ft = chunks.of_states(bundle, np.arange(len(bundle.states)))
    for i in range(len(ft)):
        assert ft.ts[int(ft.mate[i])] == ft.ts[i]


def test_verdict_of_a_sample_does_not_depend_on_later_samples() -> None:
    bundle = _two_samples()
    first = np.flatnonzero(bundle.states["ts"] == 2 * S)
    alone = chunks.verdicts(chunks.of_states(bundle, first))
    assert alone.net_blocked.any()  # the receiver had buffers: the sender's side is at fault
    ft = chunks.of_states(bundle, np.arange(len(bundle.states)))
    v = chunks.verdicts(ft)
    early_send = ft.send & (ft.ts == 2 * S)
    assert v.net_blocked[early_send].all() and not v.receiver_not_ready[early_send].any()


def _late_receiver(receiver_ts: int, receiver_start: int) -> tables.Bundle:
    """Hop 1 -> 2 of seq 2: at 2 s the sender holds ready chunks (ready > sent); the receiver's
    only sample, at ``receiver_ts``, shows buffers posted (posted > done)."""
    b = tables.BundleBuilder(models.Job(world_size=3))
    b.add_state(
        rank=1,
        ts=2 * S,
        comm="0xa",
        seq=2,
        op="AllReduce",
        nbytes=T,
        start=S,
        flows=[_send(0, 2, 6, 2, 2)],
    )
    b.add_state(
        rank=2,
        ts=receiver_ts,
        comm="0xa",
        seq=2,
        op="AllReduce",
        nbytes=T,
        start=receiver_start,
        flows=[_recv(0, 1, 8, 2, 2)],
    )
    return b.build()


def test_a_send_is_never_judged_by_a_receiver_sample_taken_after_it() -> None:
    # The receiver entered 50 ms after the sender's sample: at the instant judged it had posted
    # nothing (NCCL's sender proxy waits for its credits, ProxyStep SendPeerWait), so its later
    # free buffers say nothing about why the sender held its chunks.
    later = _late_receiver(2 * S + 50_000_000, 2 * S + 40_000_000)
    ft = chunks.of_states(later, np.arange(len(later.states)))
    v = chunks.verdicts(ft)
    snd = int(np.flatnonzero(ft.send).item())
    assert int(ft.mate[snd]) == -1
    assert not v.net_blocked[snd] and not v.receiver_not_ready[snd]
    # The same receiver sampled 30 ms before the sender's sample is what it looked like then.
    earlier = _late_receiver(2 * S - 30_000_000, S)
    ft = chunks.of_states(earlier, np.arange(len(earlier.states)))
    snd = int(np.flatnonzero(ft.send).item())
    assert int(ft.mate[snd]) == int(np.flatnonzero(~ft.send).item())
    assert chunks.verdicts(ft).net_blocked[snd]


def test_a_later_sample_of_a_frozen_receiver_still_shows_the_instant() -> None:
    # The receiver's flow has not changed for 2 s when sampled 50 ms after the sender: it looked
    # the same at the sender's instant (a hang's last samples, taken at different phases).
    b = tables.BundleBuilder(models.Job(world_size=3))
    b.add_state(
        rank=1,
        ts=2 * S,
        comm="0xa",
        seq=2,
        op="AllReduce",
        nbytes=T,
        start=S,
        flows=[_send(0, 2, 6, 2, 2)],
    )
    frozen = (0, 1, tables.RECV, T, -1, -1, 8, 2, 2, 2 * S)
    b.add_state(
        rank=2,
        ts=2 * S + 50_000_000,
        comm="0xa",
        seq=2,
        op="AllReduce",
        nbytes=T,
        start=S,
        flows=[frozen],
    )
    bundle = b.build()
    ft = chunks.of_states(bundle, np.arange(len(bundle.states)))
    snd = int(np.flatnonzero(ft.send).item())
    assert int(ft.mate[snd]) == int(np.flatnonzero(~ft.send).item())
    assert chunks.verdicts(ft).net_blocked[snd]
